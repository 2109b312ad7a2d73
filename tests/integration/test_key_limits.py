"""Per-key limits: ``key_limit`` slots per concurrency key, ``on_limit`` reject or queue.

Both databases, over HTTP against an in-process API and with in-process workers: a burst
beyond ``key_limit=2`` admits exactly two runs and answers 409 naming the oldest; with
``on_limit="queue"`` the rest wait unclaimable (``blocked_reason``) and start strictly in
submission order as holders finish, while another key runs at once; cancelling a waiter
just cancels it, cancelling a holder admits the oldest waiter in the same transaction; an
admitted waiter keeps its requested delay; a requeued run takes a slot back or waits; the
worker's sweep admits a waiter a finished holder left behind; and the lost-wakeup race
(a submission deciding to wait while the last holder finishes) never strands a run.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import RowMapping, select, text, update

from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.queries import slots as slots_q
from app.db.tables import dead_letters, events, runs
from app.engine import control, slots
from app.engine.journal import RunJournal
from app.engine.outcomes import Completed
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import (
    Permanent,
    RetryPolicy,
    StateMachine,
    WorkflowContext,
    state_machine,
    workflow,
)
from app.worker.worker import Worker
from tests.conftest import make_settings
from tests.integration.support import api_client, reach, workers

TENANT = "limits"
gates: dict[str, asyncio.Event] = {}


def _gate(name: str) -> asyncio.Event:
    return gates.setdefault(name, asyncio.Event())


class Item(BaseModel):
    """Input: a label for the gates, and whether to fail."""

    name: str = ""
    fail: bool = False


async def held(name: str) -> str:
    """Signal ``<name>:started``, then wait for ``<name>:release``."""
    _gate(f"{name}:started").set()
    await _gate(f"{name}:release").wait()
    return name


def refuse(name: str) -> str:
    """Fail permanently (the run goes to the dead-letter queue)."""
    raise Permanent(ValueError(f"{name} refused"))


@workflow("slot-reject", key_limit=2)
async def slot_reject(ctx: WorkflowContext, item: Item) -> str:
    """Two runs per key; a third is refused."""
    return item.name


@workflow("slot-queue", key_limit=2, on_limit="queue")
async def slot_queue(ctx: WorkflowContext, item: Item) -> str:
    """Two runs per key; more wait in order. Holds in a gated step unless asked to fail."""
    if item.fail:
        return await ctx.step(refuse, item.name, retry=RetryPolicy(max_attempts=1))
    return await ctx.step(held, item.name, retry=RetryPolicy(max_attempts=1))


@workflow("slot-one", on_limit="queue")
async def slot_one(ctx: WorkflowContext, item: Item) -> str:
    """One run per key; more wait in order. Fails when asked."""
    if item.fail:
        return await ctx.step(refuse, item.name, retry=RetryPolicy(max_attempts=1))
    return item.name


class Gate(StateMachine):
    """A state machine that parks for an hour: it holds its parent's slot meanwhile."""


class Begin(Gate):
    """Initial."""


class Hold(Gate):
    """Waits an hour (timer)."""


class End(Gate):
    """Terminal."""


@state_machine("slot-machine", initial=Begin, terminal=[End], timers={Hold: 3600}, on_limit="queue")
async def slot_machine(parent: str, item: Item, state: Gate) -> Gate:
    """Begin → Hold (an hour) → End; a second run for a busy parent waits its turn."""
    return Hold() if isinstance(state, Begin) else End()


REGISTRY = Registry([slot_reject, slot_queue, slot_one, slot_machine.definition])


@pytest.fixture
def lsettings(database_url: str, tmp_path: Path) -> Settings:
    # Long leases: no lease or sweep moves anything unless a test makes it.
    return make_settings(
        database_url, tmp_path, lease_ttl_seconds=60.0, heartbeat_interval_seconds=20.0
    )


async def _register(db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)


async def _row(db: Database, run_id: str | uuid.UUID) -> RowMapping:
    async with db.read() as conn:
        return await runs_q.get_run(conn, TENANT, uuid.UUID(str(run_id)))


async def _kinds(db: Database, run_id: str | uuid.UUID) -> list[str]:
    async with db.read() as conn:
        stmt = (
            select(events.c.kind)
            .where(events.c.run_id == uuid.UUID(str(run_id)))
            .order_by(events.c.event_id)
        )
        return [str(k) for k in (await conn.execute(stmt)).scalars()]


def _assert_waiting(run: dict[str, Any] | RowMapping, key: str, limit: int) -> None:
    assert run["status"] == "queued", run
    assert run["concurrency_slot"] is None, run
    assert run["blocked_reason"] == slots.waiting_reason(key, limit), run
    assert f"{key!r}" in run["blocked_reason"] and f"key_limit {limit}" in run["blocked_reason"]


async def test_reject_beyond_key_limit(lsettings: Settings, db: Database) -> None:
    await _register(db)
    async with api_client(lsettings, db, TENANT) as client:
        bodies = [
            {
                "workflow": "slot-reject",
                "input": {"name": str(i)},
                "concurrency_key": "k",
                "idempotency_key": f"r-{i}",
            }
            for i in range(30)
        ]
        responses = await asyncio.gather(*(client.post("/runs", json=b) for b in bodies))
        winners = [r.json() for r in responses if r.status_code == 201]
        assert len(winners) == 2, sorted(r.status_code for r in responses)
        assert sorted(w["concurrency_slot"] for w in winners) == [1, 2]
        oldest = min(winners, key=lambda w: uuid.UUID(w["run_id"]))["run_id"]
        for r in responses:
            if r.status_code == 201:
                continue
            assert r.status_code == 409, r.text
            assert r.headers["content-type"] == "application/problem+json"
            problem = r.json()
            assert problem["code"] == "concurrency_key_busy", problem
            assert problem["status"] == 409
            assert problem["active_run_id"] == oldest, problem
            assert (problem["concurrency_key"], problem["key_limit"]) == ("k", 2), problem
            assert oldest in problem["detail"] and "key_limit 2" in problem["detail"]

        # An identical retry of an admitted run is that run; of a refused one, 409 again.
        first = next(b for b in bodies if b["idempotency_key"] == winners[0]["idempotency_key"])
        again = await client.post("/runs", json=first)
        assert (again.status_code, again.json()["run_id"]) == (200, winners[0]["run_id"])
        loser = next(
            b for b in bodies if b["idempotency_key"] not in {w["idempotency_key"] for w in winners}
        )
        assert (await client.post("/runs", json=loser)).status_code == 409
        async with db.read() as conn:
            stmt = select(runs.c.run_id).where(runs.c.concurrency_key == "k")
            assert len((await conn.execute(stmt)).all()) == 2  # nothing stored for the 409s

        # Another key, and the same key of another tenant, are not affected.
        other = await client.post(
            "/runs", json={"workflow": "slot-reject", "concurrency_key": "other"}
        )
        assert (other.status_code, other.json()["concurrency_slot"]) == (201, 1)
        async with api_client(lsettings, db, "elsewhere") as theirs:
            there = await theirs.post(
                "/runs", json={"workflow": "slot-reject", "concurrency_key": "k"}
            )
            assert there.status_code == 201, there.text

        # A finished holder frees its slot for the next submission.
        async with workers(lsettings, db, REGISTRY):
            await reach(db, TENANT, uuid.UUID(oldest), "completed")
        freed = next(w["concurrency_slot"] for w in winners if w["run_id"] == oldest)
        after = await client.post(
            "/runs",
            json={"workflow": "slot-reject", "input": {"name": "x"}, "concurrency_key": "k"},
        )
        assert (after.status_code, after.json()["concurrency_slot"]) == (201, freed)


async def test_queue_admits_in_submission_order(lsettings: Settings, db: Database) -> None:
    await _register(db)
    tag = uuid.uuid4().hex[:8]
    names = [f"{tag}-{i}" for i in range(6)]
    async with api_client(lsettings, db, TENANT) as client:
        submitted = []
        for name in names:
            r = await client.post(
                "/runs",
                json={"workflow": "slot-queue", "input": {"name": name}, "concurrency_key": "q"},
            )
            assert r.status_code == 201, r.text
            submitted.append(r.json())
        assert [s["concurrency_slot"] for s in submitted[:2]] == [1, 2]
        for s in submitted[2:]:
            _assert_waiting(s, "q", 2)  # the 201 body already says why it waits
        detail = (await client.get(f"/runs/{submitted[2]['run_id']}")).json()
        _assert_waiting(detail, "q", 2)
        stored = await _row(db, submitted[2]["run_id"])
        assert stored["available_at"] is None  # not claimable
        versions = (await client.get("/workflows")).json()["items"]
        version = next(w for w in versions if w["name"] == "slot-queue")["versions"][0]
        assert version["queue_controls"]["key_limit"] == 2
        assert version["queue_controls"]["on_limit"] == "queue"
        assert (version["queued_for_slot"], version["open_runs"]) == (4, 6)

        async with workers(lsettings, db, REGISTRY, count=2, concurrency=8):
            for name in names[:2]:
                await asyncio.wait_for(_gate(f"{name}:started").wait(), 30)
            # Another key is not held up by this one.
            other = await client.post(
                "/runs",
                json={
                    "workflow": "slot-queue",
                    "input": {"name": f"{tag}-o"},
                    "concurrency_key": "o",
                },
            )
            assert other.json()["concurrency_slot"] == 1
            await asyncio.wait_for(_gate(f"{tag}-o:started").wait(), 30)
            _gate(f"{tag}-o:release").set()
            # Release the holders one at a time, out of order: each frees one slot, and
            # the oldest waiter (never a later one) takes it.
            running = list(names[:2])
            for nxt in names[2:]:
                done = running.pop()  # the newest holder finishes first
                _gate(f"{done}:release").set()
                await asyncio.wait_for(_gate(f"{nxt}:started").wait(), 30)
                running.append(nxt)
                later = names[names.index(nxt) + 1 :]
                assert not any(_gate(f"{n}:started").is_set() for n in later), nxt
            for name in running:
                _gate(f"{name}:release").set()
            for s in submitted:
                await reach(db, TENANT, uuid.UUID(s["run_id"]), "completed")

    async with db.read() as conn:
        stmt = (
            select(events.c.run_id)
            .where(events.c.kind == "run_admitted")
            .order_by(events.c.event_id)
        )
        admitted = [str(r) for r in (await conn.execute(stmt)).scalars()]
        rows = (
            await conn.execute(
                select(runs.c.run_id, runs.c.started_at, runs.c.finished_at).where(
                    runs.c.concurrency_key == "q"
                )
            )
        ).all()
    assert admitted == [s["run_id"] for s in submitted[2:]]
    # At most two runs of the key were ever active at once (database timestamps).
    # (Intervals: the most at once is reached at some run's start.)
    for run in rows:
        at_once = [o for o in rows if o.started_at <= run.started_at < o.finished_at]
        assert len(at_once) <= 2, rows
    # The waiters started after both first holders, one by one in submission order.
    by_id = {str(r.run_id): r for r in rows}
    first_two = max(by_id[s["run_id"]].started_at for s in submitted[:2])
    waiters = [by_id[s["run_id"]] for s in submitted[2:]]
    assert all(w.started_at > first_two for w in waiters)
    assert waiters == sorted(waiters, key=lambda r: r.started_at)


async def test_cancel_waiting_and_holding_runs(lsettings: Settings, db: Database) -> None:
    await _register(db)
    async with api_client(lsettings, db, TENANT) as client:

        async def post(**body: Any) -> dict[str, Any]:
            r = await client.post(
                "/runs", json={"workflow": "slot-one", "concurrency_key": "c", **body}
            )
            assert r.status_code == 201, r.text
            return dict(r.json())

        holder = await post(delay=3600)  # holds its slot while it waits to start
        first = await post(input={"name": "a"})
        second = await post(input={"name": "b"})
        third = await post(input={"name": "c"})
        # Cancelling a waiter just cancels it: nobody is admitted.
        r = await client.post(f"/runs/{first['run_id']}/cancel", json={"reason": "not needed"})
        assert (r.status_code, r.json()["status"]) == (200, "cancelled")
        assert r.json()["concurrency_slot"] is None
        _assert_waiting(await _row(db, second["run_id"]), "c", 1)
        assert (await _row(db, holder["run_id"]))["concurrency_slot"] == 1
        # Cancelling the holder admits the oldest remaining waiter in the same transaction.
        r = await client.post(f"/runs/{holder['run_id']}/cancel", json={"reason": "done"})
        assert r.status_code == 200, r.text
        admitted = await _row(db, second["run_id"])
        assert (admitted["status"], admitted["concurrency_slot"]) == ("queued", 1)
        assert admitted["available_at"] is not None and admitted["blocked_reason"] is None
        assert (await _kinds(db, second["run_id"]))[-1] == "run_admitted"
        _assert_waiting(await _row(db, third["run_id"]), "c", 1)
        assert "run_admitted" not in await _kinds(db, first["run_id"])


async def test_state_machine_queues_behind_a_busy_parent(lsettings: Settings, db: Database) -> None:
    await _register(db)
    async with api_client(lsettings, db, TENANT) as client, workers(lsettings, db, REGISTRY):

        async def start(parent: str) -> dict[str, Any]:
            body = {"workflow": "slot-machine", "concurrency_key": parent}
            r = await client.post("/runs", json=body)
            assert r.status_code == 201, r.text
            return dict(r.json())

        first = await start("p1")
        await reach(db, TENANT, uuid.UUID(first["run_id"]), "waiting_timer")
        second = await start("p1")
        _assert_waiting(second, "p1", 1)  # state machines: one active run per parent
        other = await start("p2")
        await reach(db, TENANT, uuid.UUID(other["run_id"]), "waiting_timer")
        assert (await _row(db, second["run_id"]))["status"] == "queued"
        cancelled = await client.post(f"/runs/{first['run_id']}/cancel", json={})
        assert cancelled.json()["status"] == "cancelled", cancelled.text
        await reach(db, TENANT, uuid.UUID(second["run_id"]), "waiting_timer")
        state = (await client.get(f"/runs/{second['run_id']}")).json()["state"]
        assert state["name"] == "Hold"


async def test_admission_keeps_the_requested_delay(lsettings: Settings, db: Database) -> None:
    await _register(db)
    submitter = Submitter(db, lsettings)

    async def submit(**kw: Any) -> RowMapping:
        row, _ = await submitter.submit(
            SubmitRequest(workflow="slot-one", input={}, concurrency_key="d", **kw),
            tenant_id=TENANT,
            subject="s",
        )
        return row

    holder = await submit()
    late = await submit(delay=3600)
    prompt = await submit()
    assert late["not_before"] is not None and late["available_at"] is None
    await control.cancel(db, tenant_id=TENANT, run_id=holder["run_id"], actor="op", reason=None)
    admitted = await _row(db, late["run_id"])
    now = await db.now()
    assert admitted["concurrency_slot"] == 1 and admitted["not_before"] is None
    assert admitted["available_at"] > now + timedelta(seconds=3500)
    # It holds the slot while it waits for its start time: the next one keeps waiting.
    _assert_waiting(await _row(db, prompt["run_id"]), "d", 1)


async def test_requeue_takes_a_slot_back_or_waits(lsettings: Settings, db: Database) -> None:
    await _register(db)
    async with api_client(lsettings, db, TENANT) as client, workers(lsettings, db, REGISTRY):
        body = {"workflow": "slot-one", "concurrency_key": "r"}
        dead = (
            await client.post("/runs", json={**body, "input": {"name": "d", "fail": True}})
        ).json()
        await reach(db, TENANT, uuid.UUID(dead["run_id"]), "failed")
        # The slot is free while the run is dead: a new run takes it and keeps it.
        holder = (await client.post("/runs", json={**body, "delay": 3600})).json()
        assert holder["concurrency_slot"] == 1
        retry = await client.post(f"/runs/{dead['run_id']}/retry", json={"reason": "again"})
        assert retry.status_code == 200, retry.text
        assert retry.json()["status"] == "requeued"
        _assert_waiting(await _row(db, dead["run_id"]), "r", 1)
        assert (await _row(db, dead["run_id"]))["available_at"] is None
        # When the holder ends, the requeued run is admitted and runs again.
        await client.post(f"/runs/{holder['run_id']}/cancel", json={})
        again = await reach(db, TENANT, uuid.UUID(dead["run_id"]), "failed")
        assert again["attempt"] == 2
        async with db.read() as conn:
            stmt = select(dead_letters.c.status).where(
                dead_letters.c.run_id == uuid.UUID(dead["run_id"])
            )
            assert sorted((await conn.execute(stmt)).scalars()) == ["pending", "requeued"]
        # With the slot free, a requeue takes it straight back.
        retry = await client.post(f"/runs/{dead['run_id']}/retry", json={"reason": "3rd"})
        assert retry.status_code == 200, retry.text
        taken = await _row(db, dead["run_id"])
        assert taken["concurrency_slot"] == 1 or taken["status"] != "queued"
        await reach(db, TENANT, uuid.UUID(dead["run_id"]), "failed")


async def test_sweep_admits_a_waiter_left_behind(lsettings: Settings, db: Database) -> None:
    await _register(db)
    submitter = Submitter(db, lsettings)
    rows = []
    for _ in range(3):
        row, _ = await submitter.submit(
            SubmitRequest(workflow="slot-one", input={}, concurrency_key="s"),
            tenant_id=TENANT,
            subject="s",
        )
        rows.append(row)
    assert await slots.sweep(db) == []  # all slots held: nothing to do
    # A holder ends on a path that did not admit (e.g. a process on older code).
    async with db.write() as conn:
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == rows[0]["run_id"])
            .values(status="completed", reason="succeeded", available_at=None)
        )
    assert await slots.sweep(db) == [rows[1]["run_id"]]
    assert (await _row(db, rows[1]["run_id"]))["concurrency_slot"] == 1
    _assert_waiting(await _row(db, rows[2]["run_id"]), "s", 1)
    assert await slots.sweep(db) == []


@pytest.mark.parametrize("finish", ["complete", "cancel"])
async def test_submission_racing_the_last_holder_never_strands(
    lsettings: Settings, db: Database, finish: str
) -> None:
    """The lost-wakeup race, many times over: submit a run while the holder finishes.

    Without ordering, the submission could see the slot held and insert a waiter while the
    finishing holder, not yet seeing that waiter, admits nobody: the waiter would wait
    forever. The key's lock orders them, so every iteration must end with the new run
    holding the slot, admitted either at submission or by the finish. The holder ends on
    the worker's path (``complete``) or by a cancel.
    """
    await _register(db)
    submitter = Submitter(db, lsettings)
    finisher = Worker(lsettings, db, REGISTRY, worker_id="race-finisher")

    async def submit(key: str) -> RowMapping:
        row, _ = await submitter.submit(
            SubmitRequest(workflow="slot-one", input={}, concurrency_key=key),
            tenant_id=TENANT,
            subject="s",
        )
        return row

    async def complete(claimed: RowMapping) -> None:
        await RunJournal(db, lsettings, claimed, "race-finisher").settle(Completed("null"))

    async def cancel(run_id: uuid.UUID) -> None:
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason=None)

    for i in range(60):
        key = f"race-{finish}-{i}"
        holder = await submit(key)
        if finish == "complete":
            async with db.write() as conn:
                claimed = await runs_q.claim_runs(
                    conn,
                    worker_id=finisher.worker_id,
                    definition_keys=[("slot-one", "1")],
                    limit=1,
                    lease_ttl=60,
                )
            assert [c["run_id"] for c in claimed] == [holder["run_id"]]
            _, new = await asyncio.gather(complete(claimed[0]), submit(key))
        else:
            _, new = await asyncio.gather(cancel(holder["run_id"]), submit(key))
        now = await _row(db, new["run_id"])
        assert now["concurrency_slot"] == 1, f"iteration {i}: stranded {dict(now)}"
        assert now["available_at"] is not None and now["blocked_reason"] is None
        assert (await _row(db, holder["run_id"]))["status"] in ("completed", "cancelled")
        # Leave nothing claimable behind for the next iteration's claim.
        await cancel(new["run_id"])


async def test_slot_queries_use_their_partial_indexes(lsettings: Settings, db: Database) -> None:
    """PostgreSQL answers "who holds / who waits for this key" from the partial indexes.

    The predicates are the indexes' own literal SQL, so even a generic plan (what a
    prepared statement ends up with, parameters unknown) can use them: with sequential
    and bitmap scans disabled the plan must name the index.
    """
    if db.dialect != "postgresql":
        pytest.skip("EXPLAIN plans are PostgreSQL's")
    queries = {
        "uq_runs_active_concurrency_slot": select(runs.c.run_id).where(
            *slots_q._key_of(TENANT, "w", "k"), slots_q._holding()
        ),
        "ix_runs_waiting_for_slot": select(runs.c.run_id)
        .where(*slots_q._key_of(TENANT, "w", "k"), slots_q._waiting())
        .order_by(runs.c.run_id)
        .limit(1),
    }
    async with db.write() as conn:
        for setting in ("enable_seqscan", "enable_bitmapscan"):
            await conn.execute(text(f"SET LOCAL {setting} = off"))
        await conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
        for n, (index, stmt) in enumerate(queries.items()):
            compiled = stmt.compile(
                dialect=conn.dialect, compile_kwargs={"render_postcompile": True}
            )
            args = ", ".join(
                "'" + str(compiled.params[name]).replace("'", "''") + "'"
                for name in compiled.positiontup or ()
            )
            await conn.exec_driver_sql(f"PREPARE slot_q{n} AS {compiled}")
            result = await conn.exec_driver_sql(f"EXPLAIN EXECUTE slot_q{n}({args})")
            plan = "\n".join(str(r[0]) for r in result)
            assert f"using {index}" in plan, plan
            await conn.exec_driver_sql(f"DEALLOCATE slot_q{n}")
