"""Retention of every table that grows with use (docs/operations.md#retention), both databases.

Each table gets rows old enough to go, rows too young, and rows a live run (or a run that
could still wait for them) needs; the audit tier must delete exactly the first, the dry
run must count exactly what the real run deletes, and batches stay bounded.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Table, func, insert, select

from app.db.database import Database
from app.db.queries import retention as qr
from app.db.tables import (
    batch_items,
    batches,
    console_sessions,
    event_waits,
    events,
    inbound_events,
    rate_limit_buckets,
    run_labels,
    runs,
    runs_archive,
    schedule_fires,
    schedules,
    signals,
    steps,
    webhook_attempts,
    webhook_deliveries,
    workers,
)
from app.engine.maintenance import Tier, run_maintenance
from tests.conftest import make_settings

OLD = 100.0  # days: past the default audit window (90)
YOUNG = 10.0

TABLES: tuple[Table, ...] = (
    runs,
    runs_archive,
    steps,
    events,
    signals,
    run_labels,
    event_waits,
    webhook_deliveries,
    webhook_attempts,
    inbound_events,
    batches,
    batch_items,
    schedules,
    schedule_fires,
    workers,
    console_sessions,
    rate_limit_buckets,
)


async def _census(db: Database) -> dict[str, int]:
    async with db.read() as conn:
        return {
            t.name: int((await conn.execute(select(func.count()).select_from(t))).scalar_one())
            for t in TABLES
        }


async def _keys(db: Database, table: Table, column: str) -> set[Any]:
    async with db.read() as conn:
        return set((await conn.execute(select(table.c[column]))).scalars())


class Seed:
    """Rows of every retained table, named by what must happen to them."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.rows: dict[Table, list[dict[str, Any]]] = {t: [] for t in TABLES}
        self.go: dict[str, set[Any]] = {}
        self.stay: dict[str, set[Any]] = {}

    def ago(self, days: float) -> datetime:
        return self.now - timedelta(days=days)

    def mark(self, table: str, key: Any, *, goes: bool) -> None:
        (self.go if goes else self.stay).setdefault(table, set()).add(key)

    def run(self, tenant: str, *, status: str, compacted: bool, created_days: float) -> uuid.UUID:
        rid = uuid.uuid4()
        terminal = status in ("completed", "failed", "cancelled", "compensated")
        self.rows[runs].append(
            {
                "run_id": rid,
                "tenant_id": tenant,
                "workflow": "wf",
                "version": "1",
                "status": status,
                "input": "null" if compacted else '{"n": 1}',
                "created_by": "seed",
                "created_at": self.ago(created_days),
                "updated_at": self.ago(created_days),
                "finished_at": self.ago(created_days - 1) if terminal else None,
                "compacted_at": self.ago(created_days - 2) if compacted else None,
                "lease_owner": "w-leasing" if status == "running" else None,
            }
        )
        return rid


def _seed(now: datetime) -> Seed:
    s = Seed(now)
    # acme: only finished, compacted runs (nothing could wait for an old event any more).
    done = s.run("acme", status="completed", compacted=True, created_days=300)
    waited = s.run("acme", status="completed", compacted=True, created_days=300)
    # globex: a live run created long ago (leased by a worker silent for the window).
    live = s.run("globex", status="running", compacted=False, created_days=300)
    # initech: a finished run not yet compacted (it can be retried, and wait again).
    retryable = s.run("initech", status="failed", compacted=False, created_days=300)

    # runs_archive: summaries finished past the window go.
    for days, goes in ((OLD, True), (OLD + 50, True), (YOUNG, False)):
        rid = uuid.uuid4()
        s.rows[runs_archive].append(
            {
                "run_id": rid,
                "tenant_id": "acme",
                "workflow": "wf",
                "version": "1",
                "status": "completed",
                "input": "null",
                "created_by": "seed",
                "created_at": s.ago(days + 1),
                "finished_at": s.ago(days),
                "archived_at": s.ago(days - 1),
            }
        )
        s.mark("runs_archive", rid, goes=goes)

    # webhook deliveries (and their attempts): final and old go, unless their run is live.
    for tenant, run_id, state, days, goes in (
        ("acme", done, "delivered", OLD, True),
        ("acme", done, "failed", OLD, True),
        ("acme", done, "delivered", OLD + 1, True),
        ("acme", done, "pending", OLD, False),
        ("acme", done, "delivered", YOUNG, False),
        ("globex", live, "delivered", OLD, False),
    ):
        did = uuid.uuid4()
        s.rows[webhook_deliveries].append(
            {
                "delivery_id": did,
                "tenant_id": tenant,
                "endpoint_id": uuid.uuid4(),
                "run_id": run_id,
                "workflow": "wf",
                "run_status": "completed",
                "finished_at": s.ago(days),
                "state": state,
                "attempts": 2,
                "created_at": s.ago(days),
                "updated_at": s.ago(days),
            }
        )
        s.mark("webhook_deliveries", did, goes=goes)
        for n in (1, 2):
            s.rows[webhook_attempts].append(
                {
                    "tenant_id": tenant,
                    "delivery_id": did,
                    "attempt": n,
                    "started_at": s.ago(days),
                    "finished_at": s.ago(days),
                    "http_status": 500 if n == 1 else 200,
                }
            )

    # inbound events: old go, unless a run could still wait for them or one received it.
    received = uuid.uuid4()
    for eid, tenant, days, goes in (
        (uuid.uuid4(), "acme", OLD, True),
        (uuid.uuid4(), "acme", OLD + 20, True),
        (uuid.uuid4(), "acme", OLD + 40, True),
        (received, "acme", OLD, False),  # delivered to a wait still on record
        (uuid.uuid4(), "acme", YOUNG, False),
        (uuid.uuid4(), "globex", OLD, False),  # the live run could wait for it
        (uuid.uuid4(), "initech", OLD, False),  # the retryable run could
    ):
        s.rows[inbound_events].append(
            {
                "event_id": eid,
                "tenant_id": tenant,
                "name": "order.paid",
                "data": "{}",
                "request_hash": "0" * 64,
                "sent_by": "seed",
                "received_at": s.ago(days),
                "started_run_ids": "[]",
            }
        )
        s.mark("inbound_events", eid, goes=goes)
    s.rows[event_waits].append(
        {
            "run_id": waited,
            "step_id": "w1",
            "tenant_id": "acme",
            "name": "order.paid",
            "match": "{}",
            "since": s.ago(300),
            "status": "delivered",
            "event_id": received,
            "delivered_at": s.ago(OLD),
        }
    )

    # batches: finished and old go with their items; running or young ones stay.
    for state, days, items, goes in (
        ("completed", OLD, 5, True),
        ("cancelled", OLD, 2, True),
        ("completed", OLD, 0, True),
        ("running", OLD, 3, False),
        ("completed", YOUNG, 2, False),
    ):
        bid = uuid.uuid4()
        s.rows[batches].append(
            {
                "batch_id": bid,
                "tenant_id": "acme",
                "action": "cancel",
                "selection": "{}",
                "params": "{}",
                "created_by": "seed",
                "state": state,
                "matched": items,
                "created_at": s.ago(days),
                "updated_at": s.ago(days),
                "finished_at": None if state == "running" else s.ago(days),
            }
        )
        s.mark("batches", bid, goes=goes)
        for _ in range(items):
            rid = uuid.uuid4()
            s.rows[batch_items].append(
                {"tenant_id": "acme", "batch_id": bid, "run_id": rid, "outcome": "done"}
            )
            s.mark("batch_items", rid, goes=goes)

    # schedules and their fires: old fires go unless their run is live or the tick is
    # still buffered; a completed one-off schedule goes once its fires have.
    def schedule(tenant: str, state: str, days: float, *, goes: bool) -> uuid.UUID:
        sid = uuid.uuid4()
        s.rows[schedules].append(
            {
                "schedule_id": sid,
                "tenant_id": tenant,
                "name": f"s-{sid}",
                "workflow": "wf",
                "input": "{}",
                "cron": None if state == "completed" else "0 * * * *",
                "timezone": "UTC",
                "at": s.ago(days) if state == "completed" else None,
                "overlap": "allow",
                "catchup_window_seconds": 60,
                "jitter_seconds": 0,
                "state": state,
                "created_by": "seed",
                "created_at": s.ago(days),
                "updated_at": s.ago(days),
            }
        )
        s.mark("schedules", sid, goes=goes)
        return sid

    hourly = schedule("acme", "active", OLD + 10, goes=False)
    other = schedule("globex", "active", OLD + 10, goes=False)
    once_old = schedule("acme", "completed", OLD, goes=True)
    once_young = schedule("acme", "completed", YOUNG, goes=False)
    fires: tuple[tuple[uuid.UUID, str, uuid.UUID | None, str, float, bool], ...] = (
        (hourly, "acme", done, "started", OLD, True),
        (hourly, "acme", None, "skipped", OLD + 1, True),
        (hourly, "acme", None, "failed", OLD + 2, True),
        (hourly, "acme", None, "buffered", OLD + 3, False),
        (hourly, "acme", done, "started", YOUNG, False),
        (other, "globex", live, "started", OLD, False),
        (once_old, "acme", done, "started", OLD, True),
        (once_young, "acme", done, "started", YOUNG, False),
    )
    for sid, tenant, fired_run, outcome, days, goes in fires:
        tick = s.ago(days)
        s.rows[schedule_fires].append(
            {
                "schedule_id": sid,
                "tick": tick,
                "tenant_id": tenant,
                "kind": "cron",
                "outcome": outcome,
                "run_id": fired_run,
                "fired_at": tick,
                "fired_by": "seed",
            }
        )
        s.mark("schedule_fires", (sid, days), goes=goes)

    # workers: silent for the window and leasing nothing go.
    for wid, days, goes in (
        ("w-dead", OLD, True),
        ("w-stopped", OLD + 5, True),
        ("w-leasing", OLD, False),
        ("w-recent", YOUNG, False),
    ):
        s.rows[workers].append(
            {
                "worker_id": wid,
                "hostname": "h",
                "pid": 1,
                "concurrency": 1,
                "definitions": "[]",
                "started_at": s.ago(days),
                "last_heartbeat_at": s.ago(days),
                "stopped_at": s.ago(days) if wid == "w-stopped" else None,
            }
        )
        s.mark("workers", wid, goes=goes)

    # console sessions: past their absolute deadline go (no window).
    for hid, expires, goes in (
        ("a" * 64, -1.0, True),
        ("b" * 64, -0.01, True),
        ("c" * 64, 1.0, False),
    ):
        s.rows[console_sessions].append(
            {
                "id_hash": hid,
                "tenant_id": "acme",
                "subject": "u",
                "token_ciphertext": "x",
                "csrf_token": "t",
                "created_at": s.ago(2),
                "last_seen_at": s.ago(1),
                "expires_at": s.now + timedelta(days=expires),
            }
        )
        s.mark("console_sessions", hid, goes=goes)

    # rate-limit buckets: a theoretical arrival time in the past is a fresh bucket.
    for bucket, tat, goes in (
        ("past", -1.0, True),
        ("long-past", -OLD, True),
        ("ahead", 0.01, False),
    ):
        s.rows[rate_limit_buckets].append(
            {"workflow": "wf", "bucket": bucket, "tat": s.now + timedelta(days=tat)}
        )
        s.mark("rate_limit_buckets", bucket, goes=goes)

    # A run's own rows are the run tiers' business: untouched here.
    s.rows[run_labels].append({"run_id": done, "tenant_id": "acme", "key": "k", "value": "v"})
    for rid, tenant in ((done, "acme"), (live, "globex"), (retryable, "initech")):
        s.rows[steps].append(
            {
                "run_id": rid,
                "step_id": "s0",
                "tenant_id": tenant,
                "seq": 0,
                "kind": "step",
                "name": "act",
                "status": "succeeded",
                "attempt": 1,
                "max_attempts": 1,
                "created_at": s.ago(300),
                "fence": 1,
            }
        )
    return s


async def _insert(db: Database, seed: Seed) -> None:
    async with db.write() as conn:
        for table in (runs, *TABLES[1:]):
            if seed.rows[table]:
                await conn.execute(insert(table), seed.rows[table])


_KEY_COLUMN = {
    "runs_archive": "run_id",
    "webhook_deliveries": "delivery_id",
    "inbound_events": "event_id",
    "batches": "batch_id",
    "batch_items": "run_id",
    "schedules": "schedule_id",
    "workers": "worker_id",
    "console_sessions": "id_hash",
    "rate_limit_buckets": "bucket",
}


async def _left(db: Database, name: str) -> set[Any]:
    if name == "schedule_fires":
        async with db.read() as conn:
            rows = (
                await conn.execute(select(schedule_fires.c.schedule_id, schedule_fires.c.tick))
            ).all()
        return {(r[0], r[1]) for r in rows}
    table = next(t for t in TABLES if t.name == name)
    return await _keys(db, table, _KEY_COLUMN[name])


async def test_audit_trims_every_growing_table_and_keeps_what_is_needed(
    db: Database, tmp_path: Path
) -> None:
    now = await db.now()
    seed = _seed(now)
    await _insert(db, seed)
    # Two rows per transaction: every walk takes several batches (keyset, bounded).
    settings = make_settings(db.url, tmp_path, maintenance_batch_size=2)
    before = await _census(db)

    dry = await run_maintenance(db, settings, tiers=[Tier.AUDIT], dry_run=True)
    assert await _census(db) == before, "a dry run changed the database"
    real = await run_maintenance(db, settings, tiers=[Tier.AUDIT])
    (dry_audit,), (audit,) = dry.tiers, real.tiers
    assert (dry_audit.touched, dry_audit.batches) == (audit.touched, audit.batches)

    expected = {name: len(keys) for name, keys in seed.go.items()}
    expected["webhook_attempts"] = 2 * expected["webhook_deliveries"]
    assert {k: v for k, v in audit.touched.items() if k not in ("events", "dead_letters")} == {
        name: expected.get(name, 0) for name in qr.report_names()
    }
    after = await _census(db)
    for name, gone in expected.items():
        assert after[name] == before[name] - gone, name
    for name in ("runs", "steps", "run_labels", "event_waits"):
        assert after[name] == before[name], name

    # Exactly the rows named "go" left; every row named "stay" is there.
    for name in seed.go.keys() | seed.stay.keys():
        left = await _left(db, name)
        if name == "schedule_fires":
            ticks = {(sid, seed.ago(days)) for sid, days in seed.stay.get(name, set())}
            assert left == ticks, name
            continue
        assert left == seed.stay.get(name, set()), name

    again = await run_maintenance(db, settings, tiers=[Tier.AUDIT], dry_run=True)
    assert all(n == 0 for n in again.tiers[0].touched.values()), again.tiers[0].touched


async def test_with_every_window_zero_nothing_of_a_finished_run_is_left(
    db: Database, tmp_path: Path
) -> None:
    """The black-box case: windows at 0, one maintenance run, no row of the run remains."""
    now = await db.now()
    s = Seed(now)
    rid = s.run("acme", status="completed", compacted=False, created_days=2)
    eid, did, bid, sid = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    s.rows[run_labels].append({"run_id": rid, "tenant_id": "acme", "key": "k", "value": "v"})
    s.rows[events].append(
        {"run_id": rid, "tenant_id": "acme", "at": s.ago(1), "kind": "run_completed"}
    )
    s.rows[inbound_events].append(
        {
            "event_id": eid,
            "tenant_id": "acme",
            "name": "e",
            "data": "{}",
            "request_hash": "0" * 64,
            "sent_by": "seed",
            "received_at": s.ago(1.5),
            "started_run_ids": json.dumps([str(rid)]),
        }
    )
    s.rows[event_waits].append(
        {
            "run_id": rid,
            "step_id": "w",
            "tenant_id": "acme",
            "name": "e",
            "match": "{}",
            "since": s.ago(2),
            "status": "delivered",
            "event_id": eid,
            "delivered_at": s.ago(1.5),
        }
    )
    s.rows[webhook_deliveries].append(
        {
            "delivery_id": did,
            "tenant_id": "acme",
            "endpoint_id": uuid.uuid4(),
            "run_id": rid,
            "workflow": "wf",
            "run_status": "completed",
            "finished_at": s.ago(1),
            "state": "delivered",
            "attempts": 1,
            "created_at": s.ago(1),
            "updated_at": s.ago(1),
        }
    )
    s.rows[webhook_attempts].append(
        {"tenant_id": "acme", "delivery_id": did, "attempt": 1, "started_at": s.ago(1)}
    )
    s.rows[batches].append(
        {
            "batch_id": bid,
            "tenant_id": "acme",
            "action": "cancel",
            "selection": "{}",
            "params": "{}",
            "created_by": "seed",
            "state": "completed",
            "matched": 1,
            "created_at": s.ago(1),
            "updated_at": s.ago(1),
            "finished_at": s.ago(1),
        }
    )
    s.rows[batch_items].append(
        {"tenant_id": "acme", "batch_id": bid, "run_id": rid, "outcome": "done"}
    )
    s.rows[schedules].append(
        {
            "schedule_id": sid,
            "tenant_id": "acme",
            "name": "once",
            "workflow": "wf",
            "input": "{}",
            "timezone": "UTC",
            "at": s.ago(2),
            "overlap": "allow",
            "catchup_window_seconds": 60,
            "jitter_seconds": 0,
            "state": "completed",
            "created_by": "seed",
            "created_at": s.ago(3),
            "updated_at": s.ago(2),
        }
    )
    s.rows[schedule_fires].append(
        {
            "schedule_id": sid,
            "tick": s.ago(2),
            "tenant_id": "acme",
            "kind": "once",
            "outcome": "started",
            "run_id": rid,
            "fired_at": s.ago(2),
            "fired_by": "seed",
        }
    )
    await _insert(db, s)
    settings = make_settings(
        db.url,
        tmp_path,
        compaction_after_days=0,
        archival_after_days=0,
        audit_retention_days=0,
    )
    dry = await run_maintenance(db, settings, dry_run=True)
    real = await run_maintenance(db, settings)
    assert [t.touched for t in dry.tiers] == [t.touched for t in real.tiers]
    archival = real.tiers[1].touched
    assert (archival["runs"], archival["run_labels"], archival["event_waits"]) == (1, 1, 1)
    left = {name: n for name, n in (await _census(db)).items() if n}
    assert left == {}, left
