"""A workflow only the HA test's long-poll worker registers (tests/ha/test_failover.py).

No other worker can claim it, so how soon a run of it starts measures that one worker's
wake-up: a NOTIFY heard on its LISTEN connection, or else its (long) poll.
"""

from __future__ import annotations

from pydantic import BaseModel

from app.sdk import WorkflowContext, workflow


class Ping(BaseModel):
    """Input: which probe this is (one run per probe, by idempotency key)."""

    n: int


@workflow("ha-wake")
async def ha_wake(ctx: WorkflowContext, job: Ping) -> int:
    """Finish at once: the test times the claim, not the work."""
    return job.n
