"""Workflows whose undo can be broken and fixed from the test (worker subprocesses).

Coordination through files in ``$TREADLE_TEST_DIR``: ``<job>.<what>.broken`` makes a step
(``charge``) or an undo (``undo-hotel``, ``undo-flight``) fail while it exists, as an
outage an operator later fixes; every call appends a line to ``<job>.calls``, so the test
counts what ran, in which order, across processes.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from app.sdk import Permanent, RetryPolicy, WorkflowContext, workflow


class Job(BaseModel):
    """Input: the job name that keys the coordination files."""

    name: str


def _dir() -> Path:
    return Path(os.environ["TREADLE_TEST_DIR"])


def _call(job: str, what: str) -> None:
    with (_dir() / f"{job}.calls").open("a") as fh:
        fh.write(what + "\n")
    if (_dir() / f"{job}.{what}.broken").exists():
        raise RuntimeError(f"{what} is broken for {job}")


def reserve(job: str, what: str) -> str:
    """Book ``what``; its undo is :func:`undo`."""
    _call(job, what)
    return f"{job}:{what}"


def undo(booking: str) -> None:
    """Undo a booking (fails while ``<job>.undo-<what>.broken`` exists)."""
    job, what = booking.split(":")
    _call(job, f"undo-{what}")


def charge(job: str) -> str:
    """Take the payment (a permanent failure while ``<job>.charge.broken`` exists)."""
    try:
        _call(job, "charge")
    except RuntimeError as exc:
        raise Permanent(exc) from None
    return "charged"


def finish(job: str) -> str:
    """The last step: must never run in a run whose bookings were undone."""
    _call(job, "finish")
    return "finished"


# A backoff far past TREADLE_INLINE_RETRY_MAX_SECONDS: the run is released while it waits.
SLOW_UNDO = RetryPolicy(max_attempts=2, backoff="fixed", delay=3600.0, jitter=0.0)


@workflow("acc-undo-saga")
async def saga(ctx: WorkflowContext, job: Job) -> str:
    """Book a flight and a hotel, charge, finish; a failed charge undoes the bookings."""
    await ctx.step(reserve, job.name, "flight", name="flight", compensate=undo)
    await ctx.step(
        reserve, job.name, "hotel", name="hotel", compensate=undo, compensate_retry=SLOW_UNDO
    )
    await ctx.step(charge, job.name)
    return await ctx.step(finish, job.name)


@workflow("acc-undo-waits")
async def waits(ctx: WorkflowContext, job: Job) -> str:
    """Book, then wait for a signal and a timer: a cancel finds it waiting."""
    await ctx.step(reserve, job.name, "flight", name="flight", compensate=undo)
    await ctx.step(reserve, job.name, "hotel", name="hotel", compensate=undo)
    await ctx.signal("go")
    await ctx.sleep(0.1)
    return await ctx.step(finish, job.name)
