"""Owner-policy definitions of every kind, for the access tests (worker subprocesses).

A workflow, a DAG and a state machine declared ``access="owner"``; a tenant-policy child
started by an owner-policy parent; and a tenant-policy workflow a colleague could try to
re-point a schedule from.
"""

from __future__ import annotations

from pydantic import BaseModel

from app.sdk import StateMachine, WorkflowContext, flow, state_machine, workflow


class Item(BaseModel):
    """Input of every definition here."""

    n: int = 1


@workflow("own-child")
async def own_child(ctx: WorkflowContext, item: Item) -> int:
    """A tenant-policy child: inherits its parent's owner policy when started by one."""
    return item.n * 10


@workflow("own-wf", access="owner")
async def own_wf(ctx: WorkflowContext, item: Item) -> dict[str, object]:
    """Starts one joined child and one detached child; returns both."""
    detached = await ctx.start_child(own_child, Item(n=item.n + 1))
    joined = await ctx.child(own_child, Item(n=item.n))
    return {"joined": joined, "detached": detached}


@workflow("own-tenant-wf")
async def own_tenant_wf(ctx: WorkflowContext, item: Item) -> int:
    """A tenant-policy workflow (the control)."""
    return item.n


def load(item: Item) -> int:
    """DAG root."""
    return item.n


def double(n: int) -> int:
    """DAG end."""
    return n * 2


own_dag = flow("own-dag", load, access="owner").then(double)


class Ticket(StateMachine):
    """The owner-policy machine."""


class Open(Ticket):
    """Initial."""


class Closed(Ticket):
    """Terminal."""

    n: int


@state_machine("own-sm", initial=Open, terminal=[Closed], access="owner")
async def own_sm(parent: str, item: Item, state: Ticket) -> Ticket:
    """Open → Closed(n)."""
    return Closed(n=item.n)
