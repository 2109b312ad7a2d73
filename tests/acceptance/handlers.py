"""Throwaway workflows for the acceptance tests (imported by worker subprocesses).

Steps coordinate with the test through files in ``$TREADLE_TEST_DIR`` so a test can hold
a step mid-flight, kill its worker, and count how often a step body completed.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from app.sdk import Permanent, RetryPolicy, WorkflowContext, current_step, workflow


def _dir() -> Path:
    return Path(os.environ["TREADLE_TEST_DIR"])


class Job(BaseModel):
    """Input: a job name used for coordination files."""

    name: str


async def hold(name: str) -> str:
    """Mark this attempt started, wait for ``<name>.release``, record completion."""
    info = current_step()
    (_dir() / f"{name}.started.{info.attempt}.{os.getpid()}").touch()
    while not (_dir() / f"{name}.release").exists():
        await asyncio.sleep(0.02)
    with (_dir() / f"{name}.completed").open("a") as fh:
        fh.write(f"{os.getpid()}\n")
    return f"pid-{os.getpid()}-attempt-{info.attempt}"


def finish(previous: str) -> str:
    """A second step after the held one."""
    return previous + "+finished"


@workflow("acc-hold")
async def hold_flow(ctx: WorkflowContext, job: Job) -> str:
    """One held step, then one quick step."""
    # One attempt only: an attempt cut short by a killed worker must not use it up.
    first = await ctx.step(hold, job.name, retry=RetryPolicy(max_attempts=1))
    return await ctx.step(finish, first)


def echo_value(value: object) -> object:
    """Return the value unchanged (round-trip check)."""
    return value


class Payload(BaseModel):
    """Arbitrary JSON to echo."""

    value: object = None


@workflow("acc-echo")
async def echo_flow(ctx: WorkflowContext, payload: Payload) -> object:
    """Echo the input through a journaled step."""
    return await ctx.step(echo_value, payload.value)


def record_account(name: str, approver: str) -> str:
    """Pretend to create an account."""
    return f"acct-{name}-{approver}"


@workflow("acc-approve")
async def approve_flow(ctx: WorkflowContext, job: Job) -> dict[str, object]:
    """Approval by a sales manager, then a documents signal, then one step."""
    decision = await ctx.approval(
        "manager", group="sales-manager", payload={"customer": job.name}, timeout=3600
    )
    docs = await ctx.signal("docs_uploaded", timeout=3600)
    account = await ctx.step(record_account, job.name, decision.decided_by[0])
    return {"account": account, "docs": docs, "comment": decision.comment}


class Nap(BaseModel):
    """Input: how long to sleep."""

    seconds: float


@workflow("acc-sleep")
async def sleep_flow(ctx: WorkflowContext, nap: Nap) -> str:
    """A durable timer between two journaled values."""
    before = await ctx.now()
    await ctx.sleep(nap.seconds)
    after = await ctx.now()
    return f"{(after - before).total_seconds():.3f}"


@workflow("acc-migrate", version=1)
async def migrate_v1(ctx: WorkflowContext, job: Job) -> str:
    """Version 1 of a workflow that waits on an approval (a run to migrate)."""
    await ctx.approval("manager", timeout=3600)
    return "v1"


@workflow("acc-migrate", version=2)
async def migrate_v2(ctx: WorkflowContext, job: Job) -> str:
    """Version 2: the same calls, so a version-1 journal replays on it."""
    await ctx.approval("manager", timeout=3600)
    return "v2"


def refuse(name: str) -> str:
    """Fail for good: the run ends ``failed`` with a dead letter."""
    raise Permanent(ValueError(f"{name} is refused"))


@workflow("acc-fail")
async def fail_flow(ctx: WorkflowContext, job: Job) -> str:
    """One step that fails permanently (dead letters for the fuzzer to requeue)."""
    return await ctx.step(refuse, job.name)


@workflow("acc-slots", key_limit=2, on_limit="queue")
async def slots_flow(ctx: WorkflowContext, job: Job) -> str:
    """Two runs per concurrency key at once, the rest wait in order; one held step."""
    return await ctx.step(hold, job.name, retry=RetryPolicy(max_attempts=1))
