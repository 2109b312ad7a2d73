"""Bounded state machines on the real engine, both databases, in-process workers and HTTP.

Each transition commits exactly once with its business row (an attempt that wrote its row
and then failed leaves nothing); a timer state waits on database time; exhausting
transitions or attempts and a tampered journal end the run dead with the right reason, a
dead letter and no payload in the error; cancel runs the compensation in its own
transaction and the run is ``cancelled`` only once it committed; ``GET /runs/{id}`` shows
the typed state; a submission without a parent is 422.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select, text, update

from app.core.settings import Settings
from app.db.database import Database
from app.db.dialect import now_plus
from app.db.tables import dead_letters, events, runs, steps
from app.engine.registry import Registry
from app.sdk import Permanent, StateMachine, current_session, current_step, state_machine
from tests.integration.support import api_client, reach, workers

TENANT = "machines"
SECRET = "s3cr3t-payload"
CREATE = (
    "CREATE TABLE IF NOT EXISTS sm_rows "
    "(parent VARCHAR(100) NOT NULL, step VARCHAR(100) NOT NULL, note VARCHAR(100) NOT NULL)"
)


class Plan(BaseModel):
    """What the test machine does; ``secret`` must never reach an error or dead letter."""

    counts: int = 2
    forever: bool = False
    fail_first: bool = False
    always_fail: bool = False
    park: bool = False
    fail_compensation: bool = False
    secret: str = SECRET


class Job(StateMachine):
    """The test machine."""


class Start(Job):
    """Initial."""


class Counting(Job):
    """Counts up."""

    n: int
    secret: str


class Parked(Job):
    """Waits 1 s (timer) before finishing."""


class Done(Job):
    """Terminal."""

    total: int


async def _record(parent: str, note: str) -> None:
    tx = current_session()
    await tx.execute(text(CREATE))
    await tx.execute(
        text("INSERT INTO sm_rows (parent, step, note) VALUES (:p, :s, :n)"),
        {"p": parent, "s": current_step().step_id, "n": note},
    )


async def compensate(parent: str, plan: Plan, state: Job) -> None:
    """Cancel: record the state it saw, in the compensation's own transaction."""
    await _record(parent, f"compensated:{state.state_name}")
    if plan.fail_compensation:
        raise RuntimeError("compensation refuses")


@state_machine(
    "sm-jobs",
    initial=Start,
    terminal=[Done],
    timers={Parked: 1},
    compensation=compensate,
    max_attempts=2,
    max_transitions=5,
)
async def jobs(parent: str, plan: Plan, state: Job) -> Job:
    """Start → Counting(1..counts) → Done(total), or Parked (1 s) → Done; see Plan."""
    await _record(parent, state.state_name)
    if plan.always_fail:
        raise RuntimeError("always failing")
    if plan.fail_first and current_step().attempt == 1:
        raise RuntimeError("first attempt fails after writing its row")
    match state:
        case Start():
            return Parked() if plan.park else Counting(n=1, secret=plan.secret)
        case Counting(n=n):
            if plan.forever or n < plan.counts:
                return Counting(n=n + 1, secret=plan.secret)
            return Done(total=n)
        case Parked():
            return Done(total=0)
    raise Permanent(ValueError(f"unexpected {state.state_name}"))


@state_machine(
    "sm-slow", initial=Start, terminal=[Done], timers={Parked: 3600}, compensation=compensate
)
async def slow(parent: str, plan: Plan, state: Job) -> Job:
    """Start → Parked (an hour) → Done: long enough to cancel or tamper with."""
    await _record(parent, state.state_name)
    return Parked() if isinstance(state, Start) else Done(total=1)


REGISTRY = Registry([jobs.definition, slow.definition])


async def _rows(db: Database, parent: str) -> list[tuple[str, str]]:
    async with db.read() as conn:
        has = await conn.run_sync(lambda c: c.dialect.has_table(c, "sm_rows"))
        if not has:
            return []
        found = await conn.execute(
            text("SELECT step, note FROM sm_rows WHERE parent = :p ORDER BY step, note"),
            {"p": parent},
        )
        return [(str(r[0]), str(r[1])) for r in found]


async def _start(client: Any, workflow: str, parent: str, **plan: Any) -> uuid.UUID:
    resp = await client.post(
        "/runs", json={"workflow": workflow, "input": plan, "concurrency_key": parent}
    )
    assert resp.status_code == 201, resp.text
    return uuid.UUID(resp.json()["run_id"])


async def _dead_letter(db: Database, run_id: uuid.UUID) -> dict[str, Any]:
    async with db.read() as conn:
        row = (
            (await conn.execute(select(dead_letters).where(dead_letters.c.run_id == run_id)))
            .mappings()
            .one()
        )
    return dict(row)


async def test_transitions_commit_once_with_their_rows(settings: Settings, db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with api_client(settings, db, TENANT) as client:
        missing = await client.post("/runs", json={"workflow": "sm-jobs", "input": {}})
        assert missing.status_code == 422, missing.text
        assert missing.json()["errors"] == [
            {"path": "concurrency_key", "message": "required for a state machine"}
        ]

        run_id = await _start(client, "sm-jobs", "p-1", counts=3, fail_first=True)
        queued = (await client.get(f"/runs/{run_id}")).json()
        assert queued["state"] == {"name": "Start", "fields": {}}, "initial before a transition"
        busy = await client.post(
            "/runs", json={"workflow": "sm-jobs", "input": {}, "concurrency_key": "p-1"}
        )
        assert (busy.status_code, busy.json()["active_run_id"]) == (409, str(run_id))

        async with workers(settings, db, REGISTRY):
            await reach(db, TENANT, run_id, "completed", "failed")
        snapshot = (await client.get(f"/runs/{run_id}")).json()
        assert (snapshot["status"], snapshot["reason"]) == ("completed", "succeeded")
        assert snapshot["output"] == {"name": "Done", "fields": {"total": 3}}
        assert snapshot["state"] == {"name": "Done", "fields": {"total": 3}}
        listed = (await client.get(f"/runs/{run_id}/steps")).json()["items"]
        assert [(s["step_id"], s["kind"], s["attempt"]) for s in listed] == [
            ("transition-1:Start", "transaction", 2),
            ("transition-2:Counting", "transaction", 2),
            ("transition-3:Counting", "transaction", 2),
            ("transition-4:Counting", "transaction", 2),
        ]
        workflows = (await client.get("/workflows")).json()["items"]
        states = next(w for w in workflows if w["name"] == "sm-jobs")["versions"][0]["states"]
        assert [(s["name"], s["initial"], s["terminal"], s["timer_seconds"]) for s in states] == [
            ("Start", True, False, None),
            ("Counting", False, False, None),
            ("Parked", False, False, 1.0),
            ("Done", False, True, None),
        ]
    # Every first attempt wrote its row and then failed: rolled back. One row per transition.
    assert await _rows(db, "p-1") == [
        ("transition-1:Start", "Start"),
        ("transition-2:Counting", "Counting"),
        ("transition-3:Counting", "Counting"),
        ("transition-4:Counting", "Counting"),
    ]


async def test_timer_state_waits_on_database_time(settings: Settings, db: Database) -> None:
    # Release the run for any wait over 0.1 s, so the 1 s timer is a real waiting_timer.
    settings = settings.model_copy(update={"inline_retry_max_seconds": 0.1})
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with api_client(settings, db, TENANT) as client, workers(settings, db, REGISTRY):
        # What a client sees while a timer state waits: on the one-hour timer, which a
        # poll cannot miss (a loaded machine can starve a poll for the 1 s one below).
        parked = await _start(client, "sm-slow", "p-parked")
        await reach(db, TENANT, parked, "waiting_timer")
        snapshot = (await client.get(f"/runs/{parked}")).json()
        assert snapshot["state"] == {"name": "Parked", "fields": {}}
        assert snapshot["waiting_on"]["kind"] == "timer"
        # A real 1 s timer, judged from the journal once the run is done.
        run_id = await _start(client, "sm-jobs", "p-timer", park=True)
        done = await reach(db, TENANT, run_id, "completed")
        async with db.read() as conn:
            released = [
                json.loads(data)
                for data in (
                    await conn.execute(
                        select(events.c.data).where(
                            events.c.run_id == run_id, events.c.kind == "run_released"
                        )
                    )
                ).scalars()
            ]
        assert [(r["status"], r["waiting_on"]) for r in released] == [("waiting_timer", "timer")]
        assert done["output"] is not None
        async with db.read() as conn:
            rows = {
                r.step_id: r
                for r in await conn.execute(select(steps).where(steps.c.run_id == run_id))
            }
        fired = rows["sleep"]
        assert (fired.finished_at - rows["transition-1:Start"].finished_at).total_seconds() >= 1.0
        assert rows["transition-2:Parked"].started_at >= fired.deadline


async def test_dead_ends_write_dead_letters_without_payloads(
    settings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with api_client(settings, db, TENANT) as client, workers(settings, db, REGISTRY):
        exhausted = await _start(client, "sm-jobs", "p-forever", forever=True)
        attempts = await _start(client, "sm-jobs", "p-fails", always_fail=True)
        corrupt = await _start(client, "sm-slow", "p-corrupt")
        await reach(db, TENANT, corrupt, "waiting_timer")
        # Tamper with the journal: the committed state is no longer a variant of Job.
        async with db.write() as conn:
            await conn.execute(
                update(steps)
                .where(steps.c.run_id == corrupt, steps.c.step_id == "transition-1:Start")
                .values(output='{"name": "Vanished", "fields": {"secret": "' + SECRET + '"}}')
            )
            past = now_plus(conn.dialect.name, -1)
            await conn.execute(
                update(steps)
                .where(steps.c.run_id == corrupt, steps.c.step_id == "sleep")
                .values(deadline=past)
            )
            await conn.execute(
                update(runs).where(runs.c.run_id == corrupt).values(available_at=past)
            )
        expected = {
            exhausted: "failure_transitions_exhausted",
            attempts: "failure_attempts_exhausted",
            corrupt: "failure_corrupt_state",
        }
        for run_id, reason in expected.items():
            row = await reach(db, TENANT, run_id, "failed", "completed", "compensated")
            assert (row["status"], row["reason"]) == ("failed", reason), row["error"]
            letter = await _dead_letter(db, run_id)
            assert letter["reason"] == reason
            assert SECRET not in (letter["error"] or ""), (reason, letter["error"])
            assert SECRET not in (row["error"] or "")
        # The failure paths run no compensation: a dead machine waits for an operator.
        assert not [n for _, n in await _rows(db, "p-forever") if n.startswith("compensated")]
        assert len(await _rows(db, "p-forever")) == 5  # max_transitions rows, each once
        assert await _rows(db, "p-fails") == []  # both attempts rolled back
        snapshot = (await client.get(f"/runs/{corrupt}")).json()
        assert snapshot["state"] is None  # undecodable: withheld (docs/api.md, state)
        assert "'Vanished' is not a variant of Job" in snapshot["error"]["message"]


TAMPERED = "tampered-field-value"
"""Written into a journaled state by the test: no view may show it once it is corrupt."""


async def test_corrupt_state_is_withheld_from_every_view(settings: Settings, db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    tampered = {
        # An unknown variant, and a known variant whose fields no longer validate.
        "p-vanished": {"name": "Vanished", "fields": {"note": TAMPERED}},
        "p-mistyped": {"name": "Counting", "fields": {"n": TAMPERED, "secret": TAMPERED}},
    }
    async with api_client(settings, db, TENANT) as client, workers(settings, db, REGISTRY):
        started = {parent: await _start(client, "sm-slow", parent) for parent in tampered}
        for parent, run_id in started.items():
            await reach(db, TENANT, run_id, "waiting_timer")
            async with db.write() as conn:
                await conn.execute(
                    update(steps)
                    .where(steps.c.run_id == run_id, steps.c.step_id == "transition-1:Start")
                    .values(output=json.dumps(tampered[parent]))
                )
            # Before the worker looks again: an unregistered variant is not shown either.
            if parent == "p-vanished":
                waiting = (await client.get(f"/runs/{run_id}")).json()
                assert (waiting["status"], waiting["state"]) == ("waiting_timer", None)
            async with db.write() as conn:
                past = now_plus(conn.dialect.name, -1)
                await conn.execute(
                    update(steps)
                    .where(steps.c.run_id == run_id, steps.c.step_id == "sleep")
                    .values(deadline=past)
                )
                await conn.execute(
                    update(runs).where(runs.c.run_id == run_id).values(available_at=past)
                )
        for parent, run_id in started.items():
            row = await reach(db, TENANT, run_id, "failed", "completed")
            assert (row["status"], row["reason"]) == ("failed", "failure_corrupt_state"), parent
            snapshot = (await client.get(f"/runs/{run_id}")).json()
            assert snapshot["state"] is None, parent
            assert snapshot["error"]["step_id"] == "transition-1:Start"
            report = await client.get(f"/runs/{run_id}/report")
            assert report.json()["run"]["state"] is None
            listed = (await client.get(f"/runs/{run_id}/steps")).json()["items"]
            transition = next(s for s in listed if s["step_id"] == "transition-1:Start")
            assert transition["output"] is None, "the undecodable state is the step's output"
            reads = {
                "snapshot": await client.get(f"/runs/{run_id}"),
                "list": await client.get("/runs", params={"workflow": "sm-slow"}),
                "steps": await client.get(f"/runs/{run_id}/steps"),
                "events": await client.get(f"/runs/{run_id}/events"),
                "report json": report,
                "report text": await client.get(f"/runs/{run_id}/report?format=text"),
                "result": await client.get(f"/runs/{run_id}/result"),
                "dead letters": await client.get("/dead-letters"),
            }
            for what, resp in reads.items():
                assert resp.status_code == 200, (what, resp.text)
                assert TAMPERED not in resp.text, (parent, what)


async def test_cancel_runs_the_compensation_in_a_transaction(
    settings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with api_client(settings, db, TENANT) as client, workers(settings, db, REGISTRY):
        ok = await _start(client, "sm-slow", "p-cancel")
        refused = await _start(client, "sm-slow", "p-refuse", fail_compensation=True)
        for run_id in (ok, refused):
            await reach(db, TENANT, run_id, "waiting_timer")
            resp = await client.post(f"/runs/{run_id}/cancel", json={"reason": "stop"})
            assert resp.status_code in (200, 202), resp.text
        cancelled = await reach(db, TENANT, ok, "cancelled", "failed")
        assert (cancelled["status"], cancelled["reason"]) == ("cancelled", "canceled_by_request")
        assert await _rows(db, "p-cancel") == [
            ("transition-1:Start", "Start"),
            ("transition-1:Start__compensate", "compensated:Parked"),
        ]
        listed = (await client.get(f"/runs/{ok}/steps")).json()["items"]
        assert [(s["step_id"], s["kind"], s["status"]) for s in listed] == [
            ("transition-1:Start", "transaction", "compensated"),
            ("sleep", "timer", "cancelled"),
            ("transition-1:Start__compensate", "compensation", "succeeded"),
        ]

        # A compensation that cannot commit: the run is never reported cancelled.
        failed = await reach(db, TENANT, refused, "cancelled", "failed")
        assert failed["status"] == "failed", failed["error"]
        assert await _rows(db, "p-refuse") == [("transition-1:Start", "Start")]
        # The key is free again once the run is terminal.
        again = await _start(client, "sm-slow", "p-cancel")
        assert again != ok
