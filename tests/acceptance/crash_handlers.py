"""Workflows for the crash-point tests of attempt numbering (imported by worker subprocesses).

A step appends each attempt's number to ``<name>.attempts`` in ``$TREADLE_TEST_DIR`` as
the attempt begins, so the test reads exactly which attempts ran, in order, whatever
worker ran them. It fails its first attempt (the retry backoff follows) and, when asked,
holds an attempt until ``<name>.release`` exists, so the test can kill its worker then.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession

from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow


def _dir() -> Path:
    return Path(os.environ["TREADLE_TEST_DIR"])


class Backoff(BaseModel):
    """Input: the job name, the backoff after attempt 1 (s), the attempt to hold (0: none)."""

    name: str
    delay: float
    hold: int = 0
    transactional: bool = False


async def _attempt(name: str, hold: int) -> str:
    attempt = current_step().attempt
    with (_dir() / f"{name}.attempts").open("a") as fh:
        fh.write(f"{attempt}\n")
    if attempt == hold:
        (_dir() / f"{name}.holding.{attempt}").touch()
        while not (_dir() / f"{name}.release").exists():
            await asyncio.sleep(0.02)
    if attempt == 1:
        raise ConnectionError("first attempt fails")
    return f"ok on attempt {attempt}"


async def flaky_once(name: str, hold: int) -> str:
    """Fail attempt 1; hold attempt ``hold`` until released; succeed otherwise."""
    return await _attempt(name, hold)


async def flaky_once_tx(tx: AsyncSession, name: str, hold: int) -> str:
    """:func:`flaky_once` as a transactional step."""
    return await _attempt(name, hold)


@workflow("crash-backoff")
async def backoff_flow(ctx: WorkflowContext, job: Backoff) -> str:
    """One step with two attempts and a fixed backoff of ``job.delay`` seconds."""
    policy = RetryPolicy(max_attempts=2, backoff="fixed", delay=job.delay)
    if job.transactional:
        return await ctx.transaction(flaky_once_tx, job.name, job.hold, retry=policy)
    return await ctx.step(flaky_once, job.name, job.hold, retry=policy)
