"""Queue controls a workflow declares: per-key limit, global limit, rate limit.

Declared on ``@workflow(...)`` / ``@state_machine(...)``, registered with the definition
(``workflow_definitions.queue_controls``) and enforced by the engine across every API and
worker process (docs/authoring.md "Queue controls", DESIGN.md §1). Priority is not declared
here: it is chosen per run at submit time (``POST /runs`` ``priority``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

OnLimit = Literal["reject", "queue"]
RateLimitBy = Literal["workflow", "key"]

KEY_LIMIT_MAX = 1_000
CONCURRENCY_LIMIT_MAX = 100_000
RATE_PER_SECOND_MAX = 10_000.0
RATE_BURST_MAX = 10_000
PRIORITY_MIN = -100
PRIORITY_MAX = 100


class QueueControlsError(ValueError):
    """A queue control is out of range; the message names the field."""


@dataclass(frozen=True)
class RateLimit:
    """At most ``per_second`` run starts per second, with bursts of up to ``burst``.

    A generic cell rate algorithm (GCRA, ITU-T I.371; the token bucket's equivalent) on
    database time: a run's *first* start (not its resumptions after timers, approvals or
    retries) is delayed until it conforms. ``by="workflow"`` shares one budget across all
    runs of the workflow (every tenant: it protects what the workflow calls);
    ``by="key"`` gives each concurrency key its own budget (runs without a key share one).

    Raises:
        QueueControlsError: ``per_second`` outside (0, 10,000], ``burst`` outside
            1..10,000, or ``by`` unknown.
    """

    per_second: float
    burst: int = 1
    by: RateLimitBy = "workflow"

    def __post_init__(self) -> None:
        rate = self.per_second
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise QueueControlsError("rate_limit.per_second: must be a number")
        if not math.isfinite(rate) or not 0 < rate <= RATE_PER_SECOND_MAX:
            raise QueueControlsError(
                f"rate_limit.per_second: {rate!r} is outside (0, {RATE_PER_SECOND_MAX:,.0f}]"
            )
        _check_int("rate_limit.burst", self.burst, 1, RATE_BURST_MAX)
        if self.by not in ("workflow", "key"):
            raise QueueControlsError(f"rate_limit.by: {self.by!r} is not 'workflow' or 'key'")

    @property
    def interval_seconds(self) -> float:
        """Seconds between conforming starts at the sustained rate (``1 / per_second``)."""
        return 1.0 / self.per_second


@dataclass(frozen=True)
class QueueControls:
    """The queue controls of one workflow definition.

    Attributes:
        key_limit: at most this many active (non-terminal) runs per (tenant, workflow,
            concurrency key); 1..1,000, default 1. Runs without a concurrency key are not
            limited by it.
        on_limit: what a submission beyond ``key_limit`` gets: ``"reject"`` (409
            ``concurrency_key_busy`` naming an active run) or ``"queue"`` (the run is
            accepted ``queued`` and admitted in submission order when a slot frees).
        concurrency_limit: at most this many runs of the workflow executing at once (holding
            a lease), across all workers and tenants; None for no limit; 1..100,000.
        rate_limit: a :class:`RateLimit` on run starts, or None.

    Raises:
        QueueControlsError: a value is out of range (the message names the field).
    """

    key_limit: int = 1
    on_limit: OnLimit = "reject"
    concurrency_limit: int | None = None
    rate_limit: RateLimit | None = field(default=None)

    def __post_init__(self) -> None:
        _check_int("key_limit", self.key_limit, 1, KEY_LIMIT_MAX)
        if self.on_limit not in ("reject", "queue"):
            raise QueueControlsError(f"on_limit: {self.on_limit!r} is not 'reject' or 'queue'")
        if self.concurrency_limit is not None:
            _check_int("concurrency_limit", self.concurrency_limit, 1, CONCURRENCY_LIMIT_MAX)
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            raise QueueControlsError("rate_limit: must be a RateLimit(per_second=...)")

    @property
    def is_default(self) -> bool:
        """True when nothing beyond the default (one active run per key, reject) is set."""
        return self == QueueControls()

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored with the definition and shown by ``GET /workflows``."""
        rate = self.rate_limit
        return {
            "key_limit": self.key_limit,
            "on_limit": self.on_limit,
            "concurrency_limit": self.concurrency_limit,
            "rate_limit": None
            if rate is None
            else {"per_second": rate.per_second, "burst": rate.burst, "by": rate.by},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> QueueControls:
        """Inverse of :meth:`to_json`; None (definitions registered before 0008) → defaults.

        Raises:
            QueueControlsError: a stored value is out of range.
        """
        if not data:
            return cls()
        rate = data.get("rate_limit")
        return cls(
            key_limit=int(data.get("key_limit", 1)),
            on_limit=data.get("on_limit", "reject"),
            concurrency_limit=data.get("concurrency_limit"),
            rate_limit=None
            if rate is None
            else RateLimit(
                per_second=float(rate["per_second"]),
                burst=int(rate.get("burst", 1)),
                by=rate.get("by", "workflow"),
            ),
        )


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueueControlsError(f"{name}: {value!r} is not an integer")
    if not low <= value <= high:
        raise QueueControlsError(f"{name}: {value} is outside {low:,}..{high:,}")
