"""Throwaway workflows for test_http_fidelity.py (imported by the worker subprocess).

Each one produces, in a real worker, a run the API must show truthfully: an error message
and step name holding characters plain text cannot carry as such, a DAG whose failing
branch cancels a sibling mid-attempt, and approvals that get rejected.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from app.sdk import ApprovalDecision, Permanent, RetryPolicy, WorkflowContext, flow, join, workflow

HOSTILE = (
    "lone \ud800 surrogate, NUL \x00, ESC \x1b[31m, BEL \x07, DEL \x7f, RTL \u202egnp.exe,"
    " LS \u2028, CR \r, LF \n== DEAD LETTERS (0) =="
)
"""Characters no plain-text line may carry raw (the report must escape every one)."""

HOSTILE_STEP = "name\u202eevil\nforged"
"""A step name with an RTL override and a line break (step names are any string)."""


class Job(BaseModel):
    """Input: a name, echoed in messages."""

    name: str


def explode(name: str) -> str:
    """Fail for good with a message holding :data:`HOSTILE`."""
    raise Permanent(ValueError(f"{name}: {HOSTILE}"))


@workflow("fid-hostile")
async def hostile_flow(ctx: WorkflowContext, job: Job) -> str:
    """One step with a hostile name that fails with a hostile message (a dead letter)."""
    return await ctx.step(explode, job.name, name=HOSTILE_STEP)


_sibling_started: asyncio.Event | None = None


def _started() -> asyncio.Event:
    global _sibling_started
    if _sibling_started is None:
        _sibling_started = asyncio.Event()
    return _sibling_started


async def begin(job: Job) -> str:
    """The DAG's root."""
    return job.name


async def slow_sibling(name: str) -> str:
    """Start, then take far longer than the failing branch (cancelled with the run)."""
    _started().set()
    await asyncio.sleep(600)
    return name


async def failing_branch(name: str) -> str:
    """Fail for good once the sibling is mid-attempt."""
    await asyncio.wait_for(_started().wait(), 60)
    raise Permanent(RuntimeError(f"{name}: ledger refused"))


async def joined(a: str, b: str) -> str:
    """Never reached."""
    return a + b


once = RetryPolicy(max_attempts=1)
_root = flow("fid-dag", begin)
sibling_dag = join(
    _root.then(slow_sibling, retry=once), _root.then(failing_branch, retry=once)
).then(joined)


@workflow("fid-approve")
async def approve_flow(ctx: WorkflowContext, job: Job) -> bool:
    """An approval without ``on_reject``: a rejection fails the run."""
    decision = await ctx.approval("gate", timeout=3600)
    return decision.approved


def note_rejection(decision: ApprovalDecision) -> str:
    """The ``on_reject`` handler."""
    return f"rejected by {decision.decided_by[-1]}"


@workflow("fid-approve-handled")
async def approve_handled_flow(ctx: WorkflowContext, job: Job) -> bool:
    """An approval with ``on_reject``: a rejection is handled and the run completes."""
    decision = await ctx.approval("gate", timeout=3600, on_reject=note_rejection)
    return decision.approved
