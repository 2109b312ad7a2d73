"""A two-step workflow for the rerun acceptance test (imported by worker subprocesses).

Each step returns a fresh random token and the worker process id, so a test can tell a
replayed result (the original's token) from a re-executed one (a new token).
"""

from __future__ import annotations

import os
import uuid

from pydantic import BaseModel

from app.sdk import WorkflowContext, workflow


class Order(BaseModel):
    """Input of ``acc-rerun``."""

    order_id: str


def reserve(order_id: str) -> list[str]:
    """First step: a random reservation token and this process's id."""
    return [f"{order_id}-{uuid.uuid4().hex}", str(os.getpid())]


def charge(order_id: str) -> list[str]:
    """Second step: a random charge token and this process's id."""
    return [f"{order_id}-{uuid.uuid4().hex}", str(os.getpid())]


@workflow("acc-rerun")
async def rerun_flow(ctx: WorkflowContext, order: Order) -> dict[str, list[str]]:
    """Reserve, then charge; both results in the output."""
    reserved = await ctx.step(reserve, order.order_id)
    charged = await ctx.step(charge, order.order_id)
    return {"reserve": reserved, "charge": charged}
