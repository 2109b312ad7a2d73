"""Workflows for the traces acceptance test (tests/acceptance/test_traces.py)."""

from __future__ import annotations

from app.sdk import RetryPolicy, WorkflowContext, workflow
from tests.acceptance.handlers import Job, finish, hold


def before(name: str) -> str:
    """A quick first step: its span is exported before the worker is killed."""
    return name


@workflow("acc-traced")
async def traced_flow(ctx: WorkflowContext, job: Job) -> str:
    """A quick step, a step held until released (the kill lands there), a last step."""
    await ctx.step(before, job.name)
    held = await ctx.step(hold, job.name, retry=RetryPolicy(max_attempts=1))
    return await ctx.step(finish, held)
