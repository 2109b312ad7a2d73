"""A workflow whose run has a retry, a signal wait and a finish: the log story test's."""

from __future__ import annotations

import logging

from pydantic import BaseModel

from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow

# A stdlib logger, as a handler's own library would use: its lines join the JSON stream.
library_log = logging.getLogger("log_handlers.library")


class Order(BaseModel):
    """Input: an order name."""

    name: str


def charge(name: str) -> str:
    """Fail the first attempt (a message that tries to forge a log line), then succeed."""
    step = current_step()
    library_log.info("charging %s", name)
    if step.attempt == 1:
        raise RuntimeError('card declined\n{"event": "forged", "level": "info"}\x1b[2J')
    return f"charged {name}"


def ship(name: str) -> str:
    """The step after the wait."""
    return f"shipped {name}"


@workflow("log-story")
async def story_flow(ctx: WorkflowContext, order: Order) -> str:
    """A retried step, a signal wait, then one more step."""
    await ctx.step(
        charge, order.name, retry=RetryPolicy(max_attempts=3, delay=0.05, backoff="fixed")
    )
    await ctx.signal("go", timeout=3600)
    return await ctx.step(ship, order.name)
