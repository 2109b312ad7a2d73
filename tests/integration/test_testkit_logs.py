"""``ctx.logger`` through the test kit: ``env.logs(run)`` (SQLite, virtual clock)."""

from __future__ import annotations

from pydantic import BaseModel

from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow
from app.sdk.testing import WorkflowTestEnv


class Order(BaseModel):
    order_id: str


def charge(order_id: str) -> str:
    step = current_step()
    step.logger.info("charging", order_id=order_id)
    if step.attempt == 1:
        raise RuntimeError("gateway timeout")
    return "ch_1"


@workflow("kit-logs")
async def kit_logs(ctx: WorkflowContext, order: Order) -> str:
    ctx.logger.info("received", order_id=order.order_id)
    await ctx.sleep(3600)  # released and replayed: "received" must not repeat
    charged = await ctx.step(charge, order.order_id, retry=RetryPolicy(max_attempts=2, delay=60))
    ctx.logger.info("charged", charge=charged)
    return charged


async def test_env_logs_lists_each_line_once_and_attempts_apart() -> None:
    async with WorkflowTestEnv([kit_logs]) as env:
        run = await env.start(kit_logs, Order(order_id="o-1"))
        assert await env.result(run) == "ch_1"
        lines = await env.logs(run)
    assert [(x.message, x.step_id, x.attempt, x.fields) for x in lines] == [
        ("received", None, None, {"order_id": "o-1"}),
        ("charging", "charge", 1, {"order_id": "o-1"}),
        ("charging", "charge", 2, {"order_id": "o-1"}),
        ("charged", None, None, {"charge": "ch_1"}),
    ]
    assert [x.seq for x in lines] == [1, 2, 3, 4]
    assert all(x.level == "info" for x in lines)
