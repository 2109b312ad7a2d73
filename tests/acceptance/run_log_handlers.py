"""Workflows for tests/acceptance/test_run_logs_http.py (imported by worker subprocesses).

The held step waits for ``$TREADLE_TEST_DIR/<name>.release`` so the test can kill its
worker mid-attempt.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow


class Job(BaseModel):
    """Input: a job name used for coordination files."""

    name: str


def greet(name: str) -> str:
    """A quick step that logs once."""
    current_step().logger.info("greeting", name=name)
    return f"hello {name}"


async def hold(name: str) -> str:
    """Log, mark the attempt started, wait for ``<name>.release``."""
    info = current_step()
    info.logger.info("holding", pid=os.getpid())
    shared = Path(os.environ["TREADLE_TEST_DIR"])
    (shared / f"{name}.started.{info.attempt}.{os.getpid()}").touch()
    while not (shared / f"{name}.release").exists():
        await asyncio.sleep(0.02)
    return f"held by attempt {info.attempt}"


@workflow("acc-logs")
async def logs_flow(ctx: WorkflowContext, job: Job) -> str:
    """Log around a step, a signal wait and a held step."""
    ctx.logger.info("start", name=job.name)
    greeting = await ctx.step(greet, job.name)
    ctx.logger.debug("waiting for go")
    go = await ctx.signal("go")
    ctx.logger.warning("resumed", go=go)
    held = await ctx.step(hold, job.name, retry=RetryPolicy(max_attempts=1))
    ctx.logger.info("done", greeting=greeting, held=held)
    return held
