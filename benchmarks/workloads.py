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
