"""Retry policies with deterministic jitter."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

Backoff = Literal["fixed", "linear", "exponential"]


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

    Raises:
        ValueError: a field is out of range.
    """

    max_attempts: int = 3
    backoff: Backoff = "exponential"
    delay: float = 1.0
    max_delay: float = 300.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 100:
            raise ValueError("RetryPolicy.max_attempts must be within 1..100")
        if self.backoff not in ("fixed", "linear", "exponential"):
            raise ValueError("RetryPolicy.backoff must be fixed, linear or exponential")
        if self.delay < 0 or self.max_delay < 0:
            raise ValueError("RetryPolicy.delay and max_delay must be >= 0 seconds")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("RetryPolicy.jitter must be within 0..1")

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


DEFAULT_RETRY = RetryPolicy()
"""Applied when ``ctx.step`` gets no ``retry=``: 3 attempts, exponential from 1 s."""
