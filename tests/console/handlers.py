"""Throwaway workflows for the console tests (imported by worker subprocesses)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.sdk import (
    Permanent,
    RetryPolicy,
    StateMachine,
    WorkflowContext,
    current_step,
    flow,
    join,
    state_machine,
    workflow,
)


class Ask(BaseModel):
    """Input of an approval run: who may decide, how many approvals, what to show."""

    group: str | None = None
    approvals: int = 1
    note: str = ""


@workflow("con-approve")
async def approve_flow(ctx: WorkflowContext, ask: Ask) -> dict[str, Any]:
    """Wait for one approval (group, N-of-M from the input); return the decision."""
    decision = await ctx.approval(
        "sign-off", group=ask.group, payload={"note": ask.note}, approvals=ask.approvals
    )
    return {"approved": decision.approved, "by": decision.decided_by}


class Note(BaseModel):
    """Any text (hostile text included)."""

    text: str = ""


@workflow("con-signal")
async def signal_flow(ctx: WorkflowContext, note: Note) -> Any:
    """Wait for signal ``go`` and return its payload."""
    return await ctx.signal("go")


def explode(text: str) -> str:
    """Always fail, permanently."""
    raise Permanent(f"exploded: {text}")


@workflow("con-fail")
async def fail_flow(ctx: WorkflowContext, note: Note) -> str:
    """One step that fails permanently: the run fails with a dead letter."""
    return await ctx.step(explode, note.text, retry=RetryPolicy(max_attempts=1))


def echo(text: str) -> str:
    """Return the text unchanged (logging it as the step's attempt)."""
    current_step().logger.info("echoing", text=text)
    return text


@workflow("con-echo")
async def echo_flow(ctx: WorkflowContext, note: Note) -> str:
    """Echo the input's text through one step, logging it before and after."""
    ctx.logger.warning(f"received {note.text}")
    echoed = await ctx.step(echo, note.text)
    ctx.logger.info("echoed", length=len(echoed))
    return echoed


class Light(StateMachine):
    """States of a lamp."""


class Red(Light):
    """Initial."""


class Green(Light):
    """Middle."""


class Off(Light):
    """Terminal."""

    note: str


@state_machine("con-machine", initial=Red, terminal=[Off], max_transitions=5)
async def lamp(parent: str, note: Note, state: Light) -> Light:
    """Red → Green → Off(note)."""
    match state:
        case Red():
            return Green()
        case Green():
            return Off(note=note.text)
    raise ValueError(f"no transition from {state.state_name}")


class Parts(BaseModel):
    """Input of the DAG: ``fail`` makes the ``weigh`` branch fail for good."""

    n: int
    fail: bool = False


class Half(BaseModel):
    """A branch's result."""

    value: int


def split(parts: Parts) -> Parts:
    """The DAG's root."""
    return parts


def count(parts: Parts) -> Half:
    """One branch."""
    return Half(value=parts.n)


def weigh(parts: Parts) -> Half:
    """The other branch (fails on request, so the graph shows a failed node)."""
    if parts.fail:
        raise Permanent("the scale is broken")
    return Half(value=2 * parts.n)


def total(a: Half, b: Half) -> int:
    """Both branches joined."""
    return a.value + b.value


root = flow("con-dag", split)
con_dag = join(root.then(count), root.then(weigh)).then(total)


class Tag(BaseModel):
    """Input of a labelling run: the label it sets, and whether it starts a child."""

    key: str
    value: str
    child: bool = False


@workflow("con-label")
async def label_flow(ctx: WorkflowContext, tag: Tag) -> str | None:
    """Set a label, optionally start a child inheriting the labels, then wait for ``go``."""
    await ctx.set_label(tag.key, tag.value)
    child = None
    if tag.child:
        child = await ctx.start_child("con-echo", {"text": "child"}, inherit_labels=True)
    await ctx.signal("go")
    return child
