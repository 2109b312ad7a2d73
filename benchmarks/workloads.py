"""Benchmark workflows.

N-step runs whose steps do no work, so the engine's own overhead (claim, checkpoints,
replay) is what gets measured.
"""

from __future__ import annotations

from pydantic import BaseModel

from app.sdk import WorkflowContext, workflow


class Steps(BaseModel):
    """How many steps the run executes."""

    steps: int = 1


def noop(i: int) -> int:
    """A step that returns at once."""
    return i


@workflow("bench-steps")
async def bench_steps(ctx: WorkflowContext, job: Steps) -> int:
    """Run ``job.steps`` sequential no-op steps."""
    total = 0
    for i in range(job.steps):
        total += await ctx.step(noop, i)
    return total


@workflow("bench-timer")
async def bench_timer(ctx: WorkflowContext, job: Steps) -> int:
    """Sleep one second on a durable timer, then run one no-op step."""
    await ctx.sleep(1.0)
    return await ctx.step(noop, job.steps)


@workflow("bench-signal")
async def bench_signal(ctx: WorkflowContext, job: Steps) -> int:
    """Wait for the signal ``go``, then run one no-op step."""
    await ctx.signal("go")
    return await ctx.step(noop, job.steps)


@workflow("bench-wait")
async def bench_wait(ctx: WorkflowContext, job: Steps) -> int:
    """Run one step, then wait an hour on a durable timer (memory benchmark)."""
    first = await ctx.step(noop, job.steps)
    await ctx.sleep(3600)
    return first
