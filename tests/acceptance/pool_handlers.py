"""Workflows holding the worker's connections, for tests/acceptance/test_db_faults.py.

A transactional step keeps its transaction (and so one pooled connection) open until the
test touches ``<name>.release`` in ``$TREADLE_TEST_DIR``; the plain step after it records
each call, so a test can tell whether a reclaimed run ran it twice.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.sdk import RetryPolicy, WorkflowContext, workflow


def _dir() -> Path:
    return Path(os.environ["TREADLE_TEST_DIR"])


class Job(BaseModel):
    """Input: a job name used for coordination files."""

    name: str


async def hold_transaction(tx: AsyncSession, name: str) -> str:
    """Open the step's transaction, mark it started, keep it open until released."""
    await tx.execute(text("SELECT 1"))
    (_dir() / f"{name}.started.{os.getpid()}").touch()
    while not (_dir() / f"{name}.release").exists():
        await asyncio.sleep(0.02)
    return f"held-by-{os.getpid()}"


def record(name: str, previous: str) -> str:
    """A plain step: append this call to ``<name>.calls``."""
    with (_dir() / f"{name}.calls").open("a") as fh:
        fh.write(f"{os.getpid()}\n")
    return previous + "+recorded"


@workflow("acc-tx-hold")
async def tx_hold_flow(ctx: WorkflowContext, job: Job) -> str:
    """A long transactional step, then a plain step."""
    held = await ctx.transaction(hold_transaction, job.name, retry=RetryPolicy(max_attempts=1))
    return await ctx.step(record, job.name, held, retry=RetryPolicy(max_attempts=1))
