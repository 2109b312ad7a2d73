"""``RetryPolicy(non_retryable=…, retry_on=…)`` in the engine, on both databases.

A step whose error the policy refuses fails at its first attempt with
``failure_non_retryable``, the rule journaled with the step's error (``not_retried``) and
shown in the text report; an error the policy allows is retried as before; a step's
timeout is retried by count whatever the rules say; transactional steps follow the same
rules. In-process workers and the real API app.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.engine.registry import Registry
from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow
from tests.conftest import make_settings
from tests.integration import support

TENANT = "retry-rules"


class CardDeclined(Exception):
    """The payment provider's refusal: retrying cannot help."""


class Case(BaseModel):
    raise_: str  # which error the step raises on its first attempt


def charge(raise_: str) -> str:
    if current_step().attempt == 1:
        if raise_ == "declined":
            raise CardDeclined("card declined")
        if raise_ == "network":
            raise ConnectionResetError("connection reset")
        raise ValueError("a bug")
    return f"charged on attempt {current_step().attempt}"


async def slow() -> str:
    if current_step().attempt == 1:
        await asyncio.Event().wait()  # never set: only the timeout ends it
    return "fast enough"


RULES = RetryPolicy(
    max_attempts=3, delay=0.0, non_retryable=(CardDeclined,), retry_on=(ConnectionError,)
)


@workflow("rules-plain")
async def plain_flow(ctx: WorkflowContext, case: Case) -> str:
    return await ctx.step(charge, case.raise_, retry=RULES)


@workflow("rules-by-name")
async def by_name_flow(ctx: WorkflowContext, case: Case) -> str:
    # Named, as a workflow names a library's error without importing it.
    policy = RetryPolicy(max_attempts=3, delay=0.0, non_retryable=("CardDeclined",))
    return await ctx.step(charge, case.raise_, retry=policy)


@workflow("rules-timeout")
async def timeout_flow(ctx: WorkflowContext, case: Case) -> str:
    # retry_on names nothing a timeout is: the timeout is retried all the same.
    policy = RetryPolicy(max_attempts=2, delay=0.0, retry_on=(CardDeclined,))
    return await ctx.step(slow, retry=policy, timeout=0.2)


@workflow("rules-transactional")
async def transactional_flow(ctx: WorkflowContext, case: Case) -> str:
    async def pay(tx: Any) -> str:
        return charge(case.raise_)

    return await ctx.transaction(pay, retry=RULES)


REGISTRY = Registry([plain_flow, by_name_flow, timeout_flow, transactional_flow])


async def _run(db: Database, settings: Any, workflow_name: str, raise_: str) -> uuid.UUID:
    return await support.submit(db, settings, REGISTRY, TENANT, workflow_name, raise_=raise_)


async def _step_error(db: Database, run_id: uuid.UUID) -> tuple[str, int, dict[str, Any]]:
    async with db.read() as conn:
        (step,) = [
            s
            for s in await steps_q.load_journal(conn, run_id, tenant_id=TENANT)
            if s["kind"] != "value"
        ]
    return step["status"], step["attempt"], json.loads(step["error"] or "null")


async def test_refused_errors_fail_at_once_and_allowed_ones_are_retried(
    database_url: str, tmp_path: Path
) -> None:
    settings = make_settings(database_url, tmp_path)
    db = Database(settings)
    try:
        cases = {
            ("rules-plain", "declined"): "failed",
            ("rules-plain", "bug"): "failed",  # not in retry_on
            ("rules-plain", "network"): "completed",  # a ConnectionError subclass
            ("rules-by-name", "declined"): "failed",
            ("rules-by-name", "bug"): "completed",  # no retry_on: retried
            ("rules-timeout", "bug"): "completed",
            ("rules-transactional", "declined"): "failed",
            ("rules-transactional", "network"): "completed",
        }
        runs = {case: await _run(db, settings, *case) for case in cases}
        async with support.workers(settings, db, REGISTRY):
            rows = {
                case: await support.reach(db, TENANT, run_id, "completed", "failed")
                for case, run_id in runs.items()
            }
        assert {case: row["status"] for case, row in rows.items()} == cases

        for case in (("rules-plain", "declined"), ("rules-transactional", "declined")):
            assert rows[case]["reason"] == "failure_non_retryable"
            status, attempt, error = await _step_error(db, runs[case])
            assert (status, attempt) == ("failed", 1), "never retried"
            assert error["type"] == "CardDeclined" and error["reason"] == "failure_non_retryable"
            assert error["not_retried"] == (
                "CardDeclined matches RetryPolicy.non_retryable (CardDeclined)"
            )
        _, attempt, error = await _step_error(db, runs[("rules-plain", "bug")])
        assert attempt == 1
        assert error["not_retried"] == "ValueError is not in RetryPolicy.retry_on (ConnectionError)"
        _, _, error = await _step_error(db, runs[("rules-by-name", "declined")])
        assert error["not_retried"] == (
            "CardDeclined matches RetryPolicy.non_retryable (CardDeclined)"
        )
        for case in (("rules-plain", "network"), ("rules-by-name", "bug")):
            assert json.loads(rows[case]["output"]) == "charged on attempt 2"
        status, attempt, _ = await _step_error(db, runs[("rules-timeout", "bug")])
        assert (status, attempt) == ("succeeded", 2), "the timed-out attempt was retried"

        # The report shows the rule under the step's error.
        declined = runs[("rules-plain", "declined")]
        async with support.api_client(settings, db, TENANT) as client:
            text = (await client.get(f"/runs/{declined}/report", params={"format": "text"})).text
            view = (await client.get(f"/runs/{declined}/steps")).json()["items"]
        assert "      error: CardDeclined: card declined" in text
        assert (
            "      not retried: CardDeclined matches RetryPolicy.non_retryable (CardDeclined)"
            in text
        )
        assert view[0]["error"]["not_retried"].startswith("CardDeclined matches")
        async with db.read() as conn:
            run = await runs_q.get_run(conn, TENANT, declined)
        assert json.loads(run["error"])["type"] == "StepFailed"
    finally:
        await db.dispose()
