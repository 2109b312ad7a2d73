"""Every view of a run tells the truth about it, on both databases (in-process API).

- A branch still running when a parallel branch fails (a typed DAG's sibling, an
  ``asyncio.gather`` branch) ends ``cancelled`` with reason ``canceled_by_failure``, and a
  step cancelled by a cancel request keeps ``canceled_by_request``.
- A rejected approval's step is ``failed`` / ``rejected_by_approver`` with or without
  ``on_reject``, in steps, counts and the report; a run that goes on after it replays the
  rejection from the journal.
- An admin's ``?tenant=`` report, steps and events show the run's own rows.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from pydantic import BaseModel

from app.core.settings import Settings
from app.db import group_commit
from app.db.database import Database
from app.engine.registry import Registry
from app.sdk import ApprovalDecision, Permanent, RetryPolicy, WorkflowContext, flow, join, workflow
from tests.helpers import wait_for
from tests.integration.support import api_client, reach, start_recorded, workers

TENANT = "views"
once = RetryPolicy(max_attempts=1)
started: dict[str, asyncio.Event] = {}


def _event(name: str) -> asyncio.Event:
    return started.setdefault(name, asyncio.Event())


class Key(BaseModel):
    """Input: a key naming this run's coordination events."""

    key: str


async def root(k: Key) -> str:
    return k.key


async def sibling(key: str) -> str:
    # Mid-attempt when its sibling fails; released by the test afterwards.
    _event(f"{key}:sibling").set()
    await asyncio.wait_for(_event(f"{key}:release").wait(), 30)
    return "late"


async def boom(key: str) -> str:
    await asyncio.wait_for(_event(f"{key}:sibling").wait(), 30)
    raise Permanent(RuntimeError("ledger refused"))


async def both(a: str, b: str) -> str:
    return a + b


_root = flow("views-dag", root)
dag = join(_root.then(sibling, retry=once), _root.then(boom, retry=once)).then(both)


@workflow("views-gather")
async def gather_flow(ctx: WorkflowContext, k: Key) -> list[str]:
    """Two imperative branches joined with asyncio.gather; one fails."""
    return list(
        await asyncio.gather(
            ctx.step(sibling, k.key, retry=once), ctx.step(boom, k.key, retry=once)
        )
    )


@workflow("views-cancel")
async def cancel_flow(ctx: WorkflowContext, k: Key) -> str:
    """One long step, cancelled by request while it runs."""
    return await ctx.step(sibling, k.key, retry=once)


def after_rejection(decision: ApprovalDecision) -> str:
    return f"noted {decision.comment}"


@workflow("views-approval")
async def approval_flow(ctx: WorkflowContext, k: Key) -> str:
    """A rejection handled by on_reject, then a signal wait: the run replays the decision."""
    decision = await ctx.approval("gate", on_reject=after_rejection)
    await ctx.signal("go")
    return "approved" if decision.approved else f"rejected: {decision.comment}"


@workflow("views-approval-strict")
async def strict_flow(ctx: WorkflowContext, k: Key) -> bool:
    """A rejection without on_reject fails the run."""
    return (await ctx.approval("gate")).approved


# Set once the sibling's start record is being written (the test makes that write slow).
start_writing: dict[str, asyncio.Event] = {}


async def boom_now() -> str:
    raise Permanent(RuntimeError("ledger refused"))


async def _fail_once_start_queued(ctx: WorkflowContext, key: str) -> str:
    # Workflow code (not a step, which would wait for its own start record): once the
    # sibling's start record is on its way to the database, not committed, a step fails
    # at once.
    await asyncio.wait_for(_event(f"{key}:sibling").wait(), 30)
    await asyncio.wait_for(start_writing[key].wait(), 30)
    return await ctx.step(boom_now, retry=once)


@workflow("views-gather-queued")
async def gather_queued_flow(ctx: WorkflowContext, k: Key) -> list[str]:
    """As views-gather, failing while the sibling's start record is being written."""
    return list(
        await asyncio.gather(
            ctx.step(sibling, k.key, retry=once), _fail_once_start_queued(ctx, k.key)
        )
    )


REGISTRY = Registry(
    [dag.definition, gather_flow, gather_queued_flow, cancel_flow, approval_flow, strict_flow]
)


async def _start(client: Any, workflow_name: str, key: str) -> uuid.UUID:
    resp = await client.post("/runs", json={"workflow": workflow_name, "input": {"key": key}})
    assert resp.status_code == 201, resp.text
    return uuid.UUID(resp.json()["run_id"])


async def _steps(client: Any, run_id: uuid.UUID, **params: str) -> dict[str, dict[str, Any]]:
    resp = await client.get(f"/runs/{run_id}/steps", params=params)
    assert resp.status_code == 200, resp.text
    return {s["step_id"]: s for s in resp.json()["items"]}


async def _step_line(client: Any, run_id: uuid.UUID, step_id: str) -> str:
    text: str = (await client.get(f"/runs/{run_id}/report", params={"format": "text"})).text
    (line,) = [x for x in text.splitlines() if f" {step_id} " in x]
    return line


async def test_branches_cancelled_by_a_failure_or_a_request_say_which(
    settings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    key = uuid.uuid4().hex[:8]
    async with api_client(settings, db, TENANT) as client, workers(settings, db, REGISTRY):
        failing = {
            name: await _start(client, name, f"{key}-{name}")
            for name in ("views-dag", "views-gather")
        }
        cancelled = await _start(client, "views-cancel", f"{key}-cancel")
        for run_id in failing.values():
            row = await reach(db, TENANT, run_id, "failed", "completed")
            assert (row["status"], row["reason"]) == ("failed", "failure_non_retryable")
        await wait_for(
            lambda: _async_true(_event(f"{key}-cancel:sibling").is_set()),
            timeout=30,
            what="the cancelled run's step started",
        )
        # An attempt cancelled before its start record is written leaves no steps row
        # (docs/adr/0040-one-commit-per-step.md); this one is listed, as ``running``.
        await start_recorded(db, cancelled)
        resp = await client.post(f"/runs/{cancelled}/cancel", json={"reason": "stop"})
        assert resp.status_code == 200, resp.text
        await reach(db, TENANT, cancelled, "cancelled")
        for name, run_id in failing.items():
            steps = await _steps(client, run_id)
            branch = steps["sibling"]
            assert (branch["status"], branch["reason"]) == ("cancelled", "canceled_by_failure")
            assert branch["error"]["reason"] == "canceled_by_failure"
            assert "failure_non_retryable at step 'boom'" in branch["error"]["message"]
            assert (steps["boom"]["status"], steps["boom"]["reason"]) == (
                "failed",
                "failure_non_retryable",
            ), name
            assert list(await _steps(client, run_id, reason="canceled_by_failure")) == ["sibling"]
            assert await _steps(client, run_id, reason="canceled_by_request") == {}
            report = (await client.get(f"/runs/{run_id}/report")).json()
            assert {s["step_id"]: s["reason"] for s in report["steps"]}["sibling"] == (
                "canceled_by_failure"
            )
            assert "(canceled_by_failure)" in await _step_line(client, run_id, "sibling")
        by_request = (await _steps(client, cancelled))["sibling"]
        assert (by_request["status"], by_request["reason"]) == ("cancelled", "canceled_by_request")
        for run_key in (f"{key}-views-dag", f"{key}-views-gather", f"{key}-cancel"):
            _event(f"{run_key}:release").set()  # the abandoned attempts end (fenced off)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_branch_whose_start_record_was_being_written_is_listed_cancelled(
    settings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run fails while a branch's held start record is queued for its write.

    The branch's attempt outlived ``TREADLE_STEP_START_RECORD_AFTER_SECONDS``, so its
    start record was on its way to the database (held 1 s by the group commit window)
    when the sibling failed and the branch was cancelled. The run's failure waits for
    that write: the branch is listed ``cancelled`` by the failure, not missing (which it
    was when the write was cut short, sent after the failure and refused by its fence).
    PostgreSQL only: SQLite writes every start record before the call (ADR 0040).
    """
    settings = settings.model_copy(update={"step_start_record_after_seconds": 0.05})
    slow = Database(settings)
    gc = group_commit.committer(slow)
    send = gc._run

    key = uuid.uuid4().hex[:8]
    start_writing[key] = asyncio.Event()

    async def slow_start(fn: Any, *, what: str = "statement") -> Any:
        if what == "start_attempt":
            start_writing[key].set()
            await asyncio.sleep(1.0)  # a start record's write that takes a second
        return await send(fn, what=what)

    monkeypatch.setattr(gc, "_run", slow_start)
    try:
        async with slow.write() as conn:
            await REGISTRY.register(conn)
        async with (
            api_client(settings, db, TENANT) as client,
            workers(settings, slow, REGISTRY),
        ):
            run_id = await _start(client, "views-gather-queued", key)
            row = await reach(db, TENANT, run_id, "failed", "completed")
            assert (row["status"], row["reason"]) == ("failed", "failure_non_retryable")
            steps = await _steps(client, run_id)
            assert set(steps) == {"sibling", "boom_now"}, steps
            assert (steps["sibling"]["status"], steps["sibling"]["reason"]) == (
                "cancelled",
                "canceled_by_failure",
            )
            _event(f"{key}:release").set()
    finally:
        await slow.dispose()


async def _async_true(value: bool) -> bool | None:
    return True if value else None


async def test_rejected_approvals_are_failed_steps(settings: Settings, db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with (
        api_client(settings, db, TENANT, subject="submitter") as client,
        api_client(settings, db, TENANT, subject="bob") as approver,
        workers(settings, db, REGISTRY),
    ):
        handled = await _start(client, "views-approval", "h")
        strict = await _start(client, "views-approval-strict", "s")
        for run_id in (handled, strict):
            await reach(db, TENANT, run_id, "waiting_approval")
            resp = await approver.post(
                f"/runs/{run_id}/approvals/gate", json={"decision": "reject", "comment": "no"}
            )
            assert resp.status_code == 200, resp.text
        failed = await reach(db, TENANT, strict, "failed")
        assert failed["reason"] == "failure_non_retryable"
        # The handled run waits for a signal after the rejection: its next claim replays
        # the rejected (failed) approval from the journal and finishes.
        await reach(db, TENANT, handled, "waiting_signal")
        resp = await client.post(f"/runs/{handled}/signals/go", json={"payload": None})
        assert resp.status_code == 202, resp.text
        done = await reach(db, TENANT, handled, "completed", "failed")
        assert done["output"] == '"rejected: no"', done["error"]
        for run_id in (handled, strict):
            gate = (await _steps(client, run_id))["gate"]
            assert (gate["status"], gate["reason"]) == ("failed", "rejected_by_approver")
            assert gate["output"]["approved"] is False
            assert gate["error"]["type"] == "ApprovalRejected"
            assert "rejected by bob: no" in gate["error"]["message"]
            assert list(await _steps(client, run_id, reason="rejected_by_approver")) == ["gate"]
            assert "gate" not in await _steps(client, run_id, status="succeeded")
            report = (await client.get(f"/runs/{run_id}/report")).json()
            assert report["steps"][0]["status"] == "failed"
            assert report["run"]["step_counts"]["failed"] == 1
            assert "(rejected_by_approver)" in await _step_line(client, run_id, "gate")
        steps = await _steps(client, handled)
        assert steps["gate.on_reject"]["output"] == "noted no"


async def test_admin_cross_tenant_reads_show_the_runs_rows(
    settings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    key = uuid.uuid4().hex[:8]
    async with (
        api_client(settings, db, TENANT) as client,
        api_client(settings, db, "operators", subject="root") as admin,
        workers(settings, db, REGISTRY),
    ):
        run_id = await _start(client, "views-dag", key)
        await reach(db, TENANT, run_id, "failed")
        _event(f"{key}:release").set()
        mine = (await client.get(f"/runs/{run_id}/report")).json()
        assert len(mine["steps"]) == 3 and mine["events"] and mine["dead_letters"]
        resp = await admin.get(f"/runs/{run_id}/report", params={"tenant": TENANT})
        assert resp.status_code == 200, resp.text
        theirs = resp.json()
        for section in ("steps", "events", "dead_letters"):
            assert theirs[section] == mine[section], section
        assert theirs["run"]["step_counts"] == mine["run"]["step_counts"]
        text = (
            await admin.get(f"/runs/{run_id}/report", params={"tenant": TENANT, "format": "text"})
        ).text
        assert "== STEPS (3) ==" in text and " sibling " in text
        for path in ("steps", "events"):
            a = (await admin.get(f"/runs/{run_id}/{path}", params={"tenant": TENANT})).json()
            b = (await client.get(f"/runs/{run_id}/{path}")).json()
            assert a["items"] == b["items"] and a["items"], path
        snapshot = (await admin.get(f"/runs/{run_id}", params={"tenant": TENANT})).json()
        assert snapshot["step_counts"] == mine["run"]["step_counts"]
        letters = (await admin.get("/dead-letters", params={"tenant": TENANT})).json()["items"]
        assert str(run_id) in {d["run_id"] for d in letters}
        # Without ?tenant= the admin reads its own tenant only: not found.
        assert (await admin.get(f"/runs/{run_id}/report")).status_code == 404
