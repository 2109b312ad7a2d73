"""A workflow whose step fails two helpers deep (imported by worker subprocesses).

For tests/acceptance/test_error_tracebacks.py: the run's error a client reads must show
these frames with relative paths, and nothing of the worker.
"""

from __future__ import annotations

from pydantic import BaseModel

from app.sdk import RetryPolicy, WorkflowContext, workflow


class Order(BaseModel):
    """Input of ``acc-error``."""

    order_id: str


def read_order_file(order_id: str) -> None:
    """Fails with a message naming an absolute path (the user's text, kept as it is)."""
    raise FileNotFoundError(f"no such file: /srv/orders/{order_id}.json")


def load_order(order_id: str) -> None:
    """The helper between the step and the failing call."""
    read_order_file(order_id)


async def charge(order_id: str) -> None:
    """The step: wraps the helper's error in its own (a cause chain)."""
    try:
        load_order(order_id)
    except FileNotFoundError as exc:
        raise RuntimeError(f"order {order_id} cannot be charged") from exc


@workflow("acc-error")
async def error_flow(ctx: WorkflowContext, order: Order) -> None:
    """One step, one attempt: the run fails at once."""
    await ctx.step(charge, order.order_id, retry=RetryPolicy(max_attempts=1))
