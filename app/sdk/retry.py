"""Retry policies: deterministic jitter, and which errors are retried at all."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Backoff = Literal["fixed", "linear", "exponential"]

ErrorMatch = type[BaseException] | str
"""An error class (it and its subclasses match) or a class name, bare (``"CardDeclined"``)
or qualified by its module (``"payments.errors.CardDeclined"``), matched against the
raised error's class and its bases: a name lets a workflow name an error of a library it
does not import, as Temporal's ``non_retryable_error_types`` does."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failing step is retried.

    Args:
        max_attempts: total attempts including the first (1 = never retry); 1..100.
        backoff: ``fixed`` (delay), ``linear`` (delay x n) or ``exponential``
            (delay x 2^(n-1)), where n is the attempt that just failed (1-based).
        delay: base delay in seconds (>= 0).
        max_delay: clamp in seconds, applied after backoff and before jitter.
        jitter: fraction 0..1 of the delay that may be taken off. Jitter is deterministic:
            derived from (run id, step id, attempt), so a replay computes the same wait
            and a thundering herd of runs still spreads out.
        non_retryable: errors (:data:`ErrorMatch`) that fail the step at its first
            occurrence (``failure_non_retryable``), as a ``Permanent`` does; wins over
            ``retry_on``.
        retry_on: when given, only these errors are retried; any other fails the step at
            once. None (the default): every ``Exception`` but ``Permanent`` is retried.
            A step's timeout is Treadle's, not the step's error: it is retried up to
            ``max_attempts`` whatever these two say.

    Raises:
        ValueError: a field is out of range, or an error entry is neither an exception
            class nor a non-empty class name.
    """

    max_attempts: int = 3
    backoff: Backoff = "exponential"
    delay: float = 1.0
    max_delay: float = 300.0
    jitter: float = 0.0
    # Any sequence is accepted; __post_init__ keeps it as a tuple.
    non_retryable: Sequence[ErrorMatch] = ()
    retry_on: Sequence[ErrorMatch] | None = None

    def __post_init__(self) -> None:
        # Lists are accepted and kept as tuples: the policy stays hashable and immutable.
        object.__setattr__(self, "non_retryable", _matches("non_retryable", self.non_retryable))
        if self.retry_on is not None:
            object.__setattr__(self, "retry_on", _matches("retry_on", self.retry_on))
        if not 1 <= self.max_attempts <= 100:
            raise ValueError("RetryPolicy.max_attempts must be within 1..100")
        if self.backoff not in ("fixed", "linear", "exponential"):
            raise ValueError("RetryPolicy.backoff must be fixed, linear or exponential")
        if self.delay < 0 or self.max_delay < 0:
            raise ValueError("RetryPolicy.delay and max_delay must be >= 0 seconds")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("RetryPolicy.jitter must be within 0..1")

    def refusal(self, exc: BaseException) -> str | None:
        """Why this policy does not retry ``exc``, or None when it may be retried.

        Returns:
            A sentence naming the rule (journaled with the step's error as
            ``not_retried`` and shown in the report): ``exc`` matches an entry of
            ``non_retryable``, or ``retry_on`` is given and no entry matches it.
        """
        hit = _first_match(self.non_retryable, exc)
        if hit is not None:
            return f"{type(exc).__name__} matches RetryPolicy.non_retryable ({hit})"
        if self.retry_on is not None and _first_match(self.retry_on, exc) is None:
            listed = ", ".join(_name(m) for m in self.retry_on) or "nothing"
            return f"{type(exc).__name__} is not in RetryPolicy.retry_on ({listed})"
        return None

    def delay_after(self, attempt: int, seed: str) -> float:
        """Seconds to wait after ``attempt`` (1-based) failed, before the next one.

        Args:
            attempt: the attempt number that just failed (>= 1).
            seed: stable identity of the step, e.g. ``"<run_id>:<step_id>"``.

        Returns:
            A delay in seconds within ``[base x (1 - jitter), base]``, where
            ``base = min(backoff(attempt), max_delay)``. Same inputs, same result.
        """
        if attempt < 1:
            raise ValueError("attempt is 1-based")
        if self.backoff == "fixed":
            base = self.delay
        elif self.backoff == "linear":
            base = self.delay * attempt
        else:
            # Cap the exponent so huge attempt numbers cannot overflow a float.
            base = self.delay * (2.0 ** min(attempt - 1, 62))
        base = min(base, self.max_delay)
        if self.jitter == 0.0 or base == 0.0:
            return base
        digest = hashlib.blake2b(f"{seed}:{attempt}".encode(), digest_size=8).digest()
        fraction = int.from_bytes(digest, "big") / 2**64  # uniform in [0, 1)
        return base * (1.0 - self.jitter * fraction)


def _matches(field: str, entries: Iterable[ErrorMatch]) -> tuple[ErrorMatch, ...]:
    if isinstance(entries, (str, type)):
        entries = (entries,)  # one entry given bare: the common slip, meant as a list of one
    kept = tuple(entries)
    for entry in kept:
        is_class = isinstance(entry, type) and issubclass(entry, BaseException)
        if not is_class and not (isinstance(entry, str) and entry.strip()):
            raise ValueError(
                f"RetryPolicy.{field} takes exception classes or class names, not {entry!r}"
            )
    return kept


def _name(entry: ErrorMatch) -> str:
    return entry if isinstance(entry, str) else entry.__qualname__


def _first_match(entries: Sequence[ErrorMatch], exc: BaseException) -> str | None:
    for entry in entries:
        if isinstance(entry, type):
            if isinstance(exc, entry):
                return _name(entry)
            continue
        for cls in type(exc).__mro__:
            if entry in (cls.__name__, cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}"):
                return entry
    return None


DEFAULT_RETRY = RetryPolicy()
"""Applied when ``ctx.step`` gets no ``retry=``: 3 attempts, exponential from 1 s."""
