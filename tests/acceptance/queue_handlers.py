"""Workflows with queue controls for tests/acceptance/test_queue_controls.py (worker side)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from app.sdk import RateLimit, WorkflowContext, workflow


class Work(BaseModel):
    """Input: how long the one step works, in seconds."""

    seconds: float = 0.0


async def busy(seconds: float) -> float:
    """Occupy the run's slot for ``seconds`` (the workload a limit exists to protect)."""
    await asyncio.sleep(seconds)
    return seconds


@workflow("acc-limited", concurrency_limit=2)
async def limited(ctx: WorkflowContext, work: Work) -> float:
    """At most two execute at once across every worker process."""
    return await ctx.step(busy, work.seconds)


@workflow("acc-metered", rate_limit=RateLimit(per_second=5))
async def metered(ctx: WorkflowContext, work: Work) -> float:
    """At most five starts a second across every worker process."""
    return await ctx.step(busy, work.seconds)
