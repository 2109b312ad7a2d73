"""Recovering undone runs (docs/adr/0009-requeue-into-compensation.md), both databases.

The class of defect: a requeue, retry or resume brought a run back in a way its history
forbids. A run whose undo failed came back running its body again (replaying the results
of undone steps as if they stood, ending ``completed``); a cancelled run came back
running; a parent whose joined child failed could never be recovered; a compensation
waiting out a long retry backoff held its lease forever. Each test drives the real worker
and the real control functions (the HTTP routes are thin over them; tests/acceptance
runs the same paths over HTTP with worker processes).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select

from app.core import json
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.tables import dead_letters, events, runs, steps
from app.engine import control
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.engine.tenants import TenantService
from app.sdk import (
    Permanent,
    RetryPolicy,
    StateMachine,
    WorkflowContext,
    current_session,
    state_machine,
    workflow,
)
from tests.conftest import make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "undo"

# What the steps and undo actions did, and which of them fail now (module-level: the
# tests flip them between a failure and the requeue, as an operator's fix would).
calls: list[str] = []
failing: set[str] = set()


class Trip(BaseModel):
    key: str


def reserve(what: str) -> str:
    calls.append(f"do:{what}")
    return f"{what}-booking"


def undo(booking: str) -> None:
    what = booking.removesuffix("-booking")
    calls.append(f"undo:{what}")
    if f"undo:{what}" in failing:
        raise RuntimeError(f"cannot undo {booking}")


def charge() -> str:
    calls.append("do:charge")
    if "charge" in failing:
        raise Permanent(ValueError("card declined"))
    return "charged"


def finish() -> str:
    calls.append("do:finish")
    return "finished"


@workflow("undo-saga")
async def saga(ctx: WorkflowContext, trip: Trip) -> str:
    await ctx.step(reserve, "flight", name="flight", compensate=undo)
    await ctx.step(reserve, "hotel", name="hotel", compensate=undo)
    await ctx.step(reserve, "car", name="car", compensate=undo)
    await ctx.step(charge)
    return await ctx.step(finish)


@workflow("undo-waits")
async def waits(ctx: WorkflowContext, trip: Trip) -> str:
    """Books, then waits (a signal, then a timer): a cancel finds it waiting."""
    await ctx.step(reserve, "flight", name="flight", compensate=undo)
    await ctx.step(reserve, "hotel", name="hotel", compensate=undo)
    await ctx.signal("go")
    await ctx.sleep(0.1)
    return await ctx.step(finish)


SLOW_UNDO = RetryPolicy(max_attempts=2, backoff="fixed", delay=3600.0, jitter=0.0)
QUICK_UNDO = RetryPolicy(max_attempts=2, backoff="fixed", delay=1.0, jitter=0.0)


@workflow("undo-retrying")
async def retrying(ctx: WorkflowContext, trip: Trip) -> str:
    """A compensation retried after a backoff longer than the inline limit."""
    policy = SLOW_UNDO if trip.key.startswith("slow") else QUICK_UNDO
    await ctx.step(reserve, "flight", name="flight", compensate=undo)
    await ctx.step(reserve, "hotel", name="hotel", compensate=undo, compensate_retry=policy)
    if trip.key.endswith("cancel"):
        await ctx.signal("go")
    await ctx.step(charge)
    return await ctx.step(finish)


class N(BaseModel):
    n: int


def square(n: int) -> int:
    calls.append(f"do:square{n}")
    if "kid" in failing:
        raise Permanent(ValueError("the child's input is refused today"))
    return n * n


@workflow("undo-kid")
async def kid(ctx: WorkflowContext, x: N) -> int:
    return await ctx.step(square, x.n)


@workflow("undo-parent")
async def parent(ctx: WorkflowContext, x: N) -> int:
    results = await asyncio.gather(ctx.child(kid, N(n=x.n)), ctx.child(kid, N(n=x.n + 1)))
    total: int = sum(results) + await ctx.step(square, 10)
    return total


class Order(StateMachine):
    """A machine that parks in a timer state, for a cancel to find it there."""


class New(Order):
    """Initial."""


class Parked(Order):
    """Waits an hour."""


class Shipped(Order):
    """Terminal."""


class Plan(BaseModel):
    note: str = ""


async def refund(parent: str, plan: Plan, state: Order) -> None:
    calls.append(f"undo:machine:{state.state_name}")
    session = current_session()
    assert session is not None
    if "undo:machine" in failing:
        raise RuntimeError("refund refused")


@state_machine(
    "undo-machine",
    initial=New,
    terminal=[Shipped],
    timers={Parked: 3600},
    compensation=refund,
    max_attempts=3,
)
async def machine(parent: str, plan: Plan, state: Order) -> Order:
    """New → Parked (an hour) → Shipped."""
    return Parked() if isinstance(state, New) else Shipped()


REGISTRY = Registry([saga, waits, retrying, kid, parent, machine.definition])


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()
    failing.clear()


@pytest.fixture
def usettings(database_url: str, tmp_path: Path) -> Settings:
    # Retries later than 0.2 s release the run (TREADLE_INLINE_RETRY_MAX_SECONDS).
    return make_settings(database_url, tmp_path, inline_retry_max_seconds=0.2)


def worker(settings: Settings, db: Database) -> Any:
    return support.workers(settings, db, REGISTRY, concurrency=4)


async def submit_machine(db: Database, settings: Settings, parent_key: str) -> uuid.UUID:
    """Submit an ``undo-machine`` run; its concurrency key is its parent."""
    async with db.write() as conn:
        await REGISTRY.register(conn)
    request = SubmitRequest(workflow="undo-machine", input={}, concurrency_key=parent_key)
    row, _ = await Submitter(db, settings).submit(request, tenant_id=TENANT, subject="s")
    run_id: uuid.UUID = row["run_id"]
    return run_id


async def reach(db: Database, run_id: uuid.UUID, *statuses: str) -> Any:
    return await support.reach(db, TENANT, run_id, *statuses, timeout=60)


async def step_statuses(db: Database, run_id: uuid.UUID) -> dict[str, str]:
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(steps.c.step_id, steps.c.status).where(steps.c.run_id == run_id)
            )
        ).all()
    return {r[0]: r[1] for r in rows}


async def statuses_seen(db: Database, run_id: uuid.UUID) -> list[str]:
    """Every status the run's timeline shows it released or finished in, in order."""
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(events.c.kind, events.c.data)
                .where(events.c.run_id == run_id)
                .order_by(events.c.event_id)
            )
        ).all()
    return [str(r[0]) + ":" + str((json.loads(r[1]) or {}).get("status", "")) for r in rows]


async def retry(db: Database, run_id: uuid.UUID) -> None:
    """``POST /runs/{id}/retry``: requeue the run's pending dead letter."""
    letter = await control.pending_dead_letter_id(db, tenant_id=TENANT, run_id=run_id)
    await control.requeue_dead_letter(
        db,
        tenant_id=TENANT,
        dead_letter_id=letter,
        actor="ops",
        reason="fixed it",
        correlation_id="INC-1",
    )


async def pending_letters(db: Database, run_id: uuid.UUID) -> int:
    async with db.read() as conn:
        found = await conn.execute(
            select(dead_letters.c.dead_letter_id).where(
                dead_letters.c.run_id == run_id, dead_letters.c.status == "pending"
            )
        )
        return len(found.all())


# --- 1. a run whose undo failed is requeued into compensation -------------------------


@pytest.mark.parametrize("fixed_body", [True, False], ids=["body-would-now-pass", "body-fails"])
async def test_requeue_after_a_failed_undo_retries_only_that_undo(
    usettings: Settings, db: Database, fixed_body: bool
) -> None:
    failing.update({"charge", "undo:hotel"})
    run_id = await support.submit(db, usettings, REGISTRY, TENANT, "undo-saga", key="a")
    async with worker(usettings, db):
        first = await reach(db, run_id, "failed", "compensated", "completed")
        assert first["status"] == "failed"
        assert "compensation_failures" in first["error"]
        assert calls == [
            "do:flight",
            "do:hotel",
            "do:car",
            "do:charge",
            "undo:car",
            "undo:hotel",
            "undo:flight",
        ]
        # The operator fixes the undo (and maybe the reason the body failed): a requeue
        # must finish the undo, never resume the body past its undone steps.
        failing.discard("undo:hotel")
        if fixed_body:
            failing.discard("charge")
        calls.clear()
        await retry(db, run_id)
        async with db.read() as conn:
            requeued = await runs_q.get_run(conn, TENANT, run_id)
        assert requeued["status"] == "compensating"
        done = await reach(db, run_id, "failed", "compensated", "completed")
    assert (done["status"], done["reason"]) == ("compensated", "failure_non_retryable")
    assert calls == ["undo:hotel"]  # only the failed undo ran again; no step of the body
    statuses = await step_statuses(db, run_id)
    assert statuses["flight"] == statuses["hotel"] == statuses["car"] == "compensated"
    assert statuses["charge"] == "failed"
    assert "finish" not in statuses
    error = json.loads(done["error"])
    assert "compensation_failures" not in error
    assert error["step_id"] == "charge"
    assert await pending_letters(db, run_id) == 0


async def test_a_failed_undo_fails_again_then_a_second_requeue_finishes_it(
    usettings: Settings, db: Database
) -> None:
    failing.update({"charge", "undo:hotel", "undo:flight"})
    run_id = await support.submit(db, usettings, REGISTRY, TENANT, "undo-saga", key="b")
    async with worker(usettings, db):
        await reach(db, run_id, "failed")
        failing.discard("undo:flight")  # only one of the two is fixed
        calls.clear()
        await retry(db, run_id)
        again = await reach(db, run_id, "failed", "compensated", "completed")
        assert again["status"] == "failed"
        assert calls == ["undo:hotel", "undo:flight"]
        assert await pending_letters(db, run_id) == 1
        failing.clear()
        calls.clear()
        await retry(db, run_id)
        done = await reach(db, run_id, "failed", "compensated", "completed")
    assert done["status"] == "compensated"
    assert calls == ["undo:hotel"]


# --- 2. a cancel request survives a failed undo, requeue, retry and resume --------------


async def test_cancelled_run_whose_undo_failed_is_requeued_into_cancelling(
    usettings: Settings, db: Database
) -> None:
    failing.add("undo:hotel")
    run_id = await support.submit(db, usettings, REGISTRY, TENANT, "undo-waits", key="c")
    async with worker(usettings, db):
        await reach(db, run_id, "waiting_signal")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="stop")
        first = await reach(db, run_id, "failed", "cancelled", "completed")
        assert first["status"] == "failed"
        failing.clear()
        calls.clear()
        await retry(db, run_id)
        async with db.read() as conn:
            assert (await runs_q.get_run(conn, TENANT, run_id))["status"] == "cancelling"
        # A signal now would let a resurrected body go on; it is buffered, never consumed.
        await control.send_signal(
            db,
            usettings,
            tenant_id=TENANT,
            run_id=run_id,
            name="go",
            payload=None,
            actor="op",
        )
        done = await reach(db, run_id, "failed", "cancelled", "completed")
    assert (done["status"], done["reason"]) == ("cancelled", "canceled_by_request")
    assert calls == ["undo:hotel"]
    statuses = await step_statuses(db, run_id)
    assert statuses["signal:go"] == "cancelled"
    assert "sleep" not in statuses and "finish" not in statuses
    seen = await statuses_seen(db, run_id)
    requeued = seen.index("dead_letter_requeued:cancelling")
    assert not any("waiting" in s or "running" in s for s in seen[requeued:]), seen


async def test_cancelled_state_machine_whose_undo_failed_never_waits_its_timer_again(
    usettings: Settings, db: Database
) -> None:
    failing.add("undo:machine")
    run_id = await submit_machine(db, usettings, "order-1")
    async with worker(usettings, db):
        await reach(db, run_id, "waiting_timer")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="stop")
        # Three attempts with backoffs of 1 s and 2 s: past the inline limit, released.
        first = await reach(db, run_id, "failed", "cancelled", "completed")
        assert first["status"] == "failed"
        assert calls == ["undo:machine:Parked"] * 3
        failing.clear()
        calls.clear()
        await retry(db, run_id)
        done = await reach(db, run_id, "failed", "cancelled", "completed")
    assert (done["status"], done["reason"]) == ("cancelled", "canceled_by_request")
    assert calls == ["undo:machine:Parked"]
    statuses = await step_statuses(db, run_id)
    assert not any(s.startswith("transition-2") for s in statuses)
    seen = await statuses_seen(db, run_id)
    requeued = seen.index("dead_letter_requeued:cancelling")
    assert not any("waiting_timer" in s or "running" in s for s in seen[requeued:]), seen


async def test_cancel_survives_a_failed_authorization_and_its_requeue(
    usettings: Settings, db: Database
) -> None:
    """A cancelling run failed for another reason (its tenant suspended) stays cancelled."""
    tenants = TenantService(db)
    run_id = await support.submit(db, usettings, REGISTRY, TENANT, "undo-waits", key="d")
    async with worker(usettings, db):
        await reach(db, run_id, "waiting_signal")
        await tenants.suspend(tenant_id=TENANT, actor="admin", reason="unpaid")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="stop")
        failed = await reach(db, run_id, "failed", "cancelled")
        assert (failed["status"], failed["reason"]) == ("failed", "failure_authorization")
        await tenants.resume(tenant_id=TENANT, actor="admin")
        calls.clear()
        await retry(db, run_id)
        done = await reach(db, run_id, "failed", "cancelled", "completed")
    assert (done["status"], done["reason"]) == ("cancelled", "canceled_by_request")
    assert calls == ["undo:hotel", "undo:flight"]


# --- 3. a parent whose joined child failed is recoverable ------------------------------


@pytest.mark.parametrize("how", ["child-retried-first", "parent-retried-alone"])
async def test_parent_of_a_failed_child_recovers(
    usettings: Settings, db: Database, how: str
) -> None:
    failing.add("kid")
    parent_id = await support.submit(db, usettings, REGISTRY, TENANT, "undo-parent", n=2)
    async with worker(usettings, db):
        failed = await reach(db, parent_id, "failed", "completed")
        assert "ChildFailed" in failed["error"]
        async with db.read() as conn:
            kids = (
                await conn.execute(select(runs.c.run_id).where(runs.c.parent_run_id == parent_id))
            ).scalars()
            kid_ids = list(kids)
        assert len(kid_ids) == 2
        for kid_id in kid_ids:
            assert (await reach(db, kid_id, "failed"))["status"] == "failed"
        failing.clear()
        if how == "child-retried-first":
            for kid_id in kid_ids:
                await retry(db, kid_id)
                await reach(db, kid_id, "completed")
            async with db.read() as conn:
                # A completed child does not move a failed parent by itself.
                assert (await runs_q.get_run(conn, TENANT, parent_id))["status"] == "failed"
        await retry(db, parent_id)
        done = await reach(db, parent_id, "failed", "completed")
        assert done["status"] == "completed", done["error"]
        assert json.loads(done["output"]) == 4 + 9 + 100
        for kid_id in kid_ids:
            assert (await reach(db, kid_id, "completed"))["status"] == "completed"
            assert await pending_letters(db, kid_id) == 0
    statuses = await step_statuses(db, parent_id)
    assert statuses["child:undo-kid"] == statuses["child:undo-kid#2"] == "succeeded"


# --- 4. waits inside compensation release the run and resume ----------------------------


async def released_in(db: Database, run_id: uuid.UUID, status: str) -> Any:
    """Poll until the run is released (no lease) in ``status``, waiting on a retry."""

    async def probe() -> Any:
        async with db.read() as conn:
            row = await runs_q.get_run(conn, TENANT, run_id)
        released = row["lease_owner"] is None and row["waiting_kind"] == "retry"
        return row if row["status"] == status and released else None

    return await wait_for(probe, timeout=60, what=f"run {run_id} released in {status}")


async def test_compensation_retry_past_the_inline_limit_releases_and_resumes(
    usettings: Settings, db: Database
) -> None:
    failing.update({"charge", "undo:hotel"})
    run_id = await support.submit(db, usettings, REGISTRY, TENANT, "undo-retrying", key="q")
    async with worker(usettings, db) as ws:
        row = await released_in(db, run_id, "compensating")
        assert row["waiting_name"] == "hotel__compensate"
        assert ws[0].in_flight == 0  # the worker's slot is free while the undo waits
        failing.discard("undo:hotel")
        done = await reach(db, run_id, "failed", "compensated", "completed")
    assert (done["status"], done["reason"]) == ("compensated", "failure_non_retryable")
    assert calls[-3:] == ["undo:hotel", "undo:hotel", "undo:flight"]


async def test_long_compensation_backoff_is_resumable_and_cancellable(
    usettings: Settings, db: Database
) -> None:
    """An hour-long backoff: released; a resume retries at once; a cancel is honoured."""
    failing.update({"charge", "undo:hotel"})
    resumed = await support.submit(db, usettings, REGISTRY, TENANT, "undo-retrying", key="slow-1")
    cancelled = await support.submit(db, usettings, REGISTRY, TENANT, "undo-retrying", key="slow-2")
    async with worker(usettings, db):
        await released_in(db, resumed, "compensating")
        await released_in(db, cancelled, "compensating")
        failing.discard("undo:hotel")
        await control.resume(db, tenant_id=TENANT, run_id=resumed, actor="op")
        done = await reach(db, resumed, "failed", "compensated", "completed")
        assert done["status"] == "compensated"
        row = await control.cancel(
            db, tenant_id=TENANT, run_id=cancelled, actor="op", reason="stop"
        )
        assert row["status"] == "cancelling"
        # Still waiting out its backoff, as cancelling: a resume keeps it cancelling.
        await released_in(db, cancelled, "cancelling")
        await control.resume(db, tenant_id=TENANT, run_id=cancelled, actor="op")
        ended = await reach(db, cancelled, "failed", "cancelled", "compensated", "completed")
    assert (ended["status"], ended["reason"]) == ("cancelled", "canceled_by_request")


async def test_cancelled_workflow_whose_undo_retries_later_is_released(
    usettings: Settings, db: Database
) -> None:
    failing.add("undo:hotel")
    run_id = await support.submit(
        db, usettings, REGISTRY, TENANT, "undo-retrying", key="quick-cancel"
    )
    async with worker(usettings, db) as ws:
        await reach(db, run_id, "waiting_signal")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="stop")
        await released_in(db, run_id, "cancelling")
        assert ws[0].in_flight == 0
        failing.clear()
        done = await reach(db, run_id, "failed", "cancelled", "completed")
    assert (done["status"], done["reason"]) == ("cancelled", "canceled_by_request")


async def test_state_machine_cancel_whose_undo_retries_later_is_released(
    usettings: Settings, db: Database
) -> None:
    failing.add("undo:machine")
    run_id = await submit_machine(db, usettings, "order-2")
    async with worker(usettings, db):
        await reach(db, run_id, "waiting_timer")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="stop")
        await released_in(db, run_id, "cancelling")
        failing.clear()
        done = await reach(db, run_id, "failed", "cancelled", "completed")
    assert (done["status"], done["reason"]) == ("cancelled", "canceled_by_request")
    assert calls[-1] == "undo:machine:Parked"
