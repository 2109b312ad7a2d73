"""Maintenance tiers on both databases: dry run equals real run, windows, live runs, reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, insert, select

from app.api.app import create_app
from app.auth.dev import DevTokens
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import retention as qr
from app.db.tables import dead_letters, events, runs, runs_archive, steps
from app.engine.maintenance import Tier, run_maintenance
from tests.conftest import DEV_SECRET, make_settings

ROOT = Path(__file__).resolve().parents[2]
TENANTS = ("acme", "globex")


@dataclass
class Seeded:
    """Run ids of each seeded group."""

    groups: dict[str, list[uuid.UUID]] = field(default_factory=dict)


async def _seed(
    db: Database,
    seeded: Seeded,
    group: str,
    count: int,
    *,
    now: datetime,
    finished_days: float | None,
    status: str = "completed",
    steps_per_run: int = 2,
    event_days: tuple[float, ...] = (),
    dead_letter_days: float | None = None,
    parent: uuid.UUID | None = None,
) -> None:
    """Insert ``count`` runs with steps, events and dead letters in a few bulk INSERTs."""
    ago = [now - timedelta(days=d) for d in event_days]
    finished = None if finished_days is None else now - timedelta(days=finished_days)
    created = now - timedelta(days=(finished_days or 0) + 200)
    ids = [uuid.uuid4() for _ in range(count)]
    seeded.groups[group] = ids
    run_rows = [
        {
            "run_id": rid,
            "tenant_id": TENANTS[i % 2],
            "workflow": "wf",
            "version": "1",
            "status": status,
            "reason": "succeeded" if status == "completed" else None,
            "input": json.dumps({"n": i, "secret": "payload"}),
            "output": json.dumps({"ok": i}) if status == "completed" else None,
            "created_by": "seed",
            "created_at": created,
            "updated_at": finished or created,
            "finished_at": finished,
            "parent_run_id": parent,
        }
        for i, rid in enumerate(ids)
    ]
    async with db.write() as conn:
        await conn.execute(insert(runs), run_rows)
        if steps_per_run:
            await conn.execute(
                insert(steps),
                [
                    {
                        "run_id": rid,
                        "step_id": f"s{k}",
                        "tenant_id": TENANTS[i % 2],
                        "seq": k,
                        "kind": "step",
                        "name": "act",
                        "status": "succeeded",
                        "attempt": 1,
                        "max_attempts": 3,
                        "output": '"result"',
                        "created_at": created,
                        "fence": 1,
                    }
                    for i, rid in enumerate(ids)
                    for k in range(steps_per_run)
                ],
            )
        if ago:
            await conn.execute(
                insert(events),
                [
                    {
                        "run_id": rid,
                        "tenant_id": TENANTS[i % 2],
                        "at": at,
                        "kind": "step_succeeded",
                        "data": '{"x":1}',
                    }
                    for i, rid in enumerate(ids)
                    for at in ago
                ],
            )
        if dead_letter_days is not None:
            await conn.execute(
                insert(dead_letters),
                [
                    {
                        "dead_letter_id": uuid.uuid4(),
                        "run_id": rid,
                        "tenant_id": TENANTS[i % 2],
                        "workflow": "wf",
                        "reason": "failure_non_retryable",
                        "status": "pending",
                        "created_at": now - timedelta(days=dead_letter_days),
                    }
                    for i, rid in enumerate(ids)
                ],
            )


async def _census(db: Database) -> dict[str, int]:
    """Row counts and non-null payload counts of every table maintenance touches."""
    async with db.read() as conn:
        out: dict[str, int] = {}
        for name, stmt in {
            "runs": select(func.count()).select_from(runs),
            "runs_with_output": select(func.count()).where(runs.c.output.is_not(None)),
            "runs_compacted": select(func.count()).where(runs.c.compacted_at.is_not(None)),
            "steps": select(func.count()).select_from(steps),
            "steps_with_output": select(func.count()).where(steps.c.output.is_not(None)),
            "events": select(func.count()).select_from(events),
            "events_with_data": select(func.count()).where(events.c.data.is_not(None)),
            "dead_letters": select(func.count()).select_from(dead_letters),
            "archive": select(func.count()).select_from(runs_archive),
        }.items():
            out[name] = int((await conn.execute(stmt)).scalar_one())
    return out


async def _run_rows(db: Database, ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    async with db.read() as conn:
        rows = (
            (await conn.execute(select(runs).where(runs.c.run_id.in_(ids)).order_by(runs.c.run_id)))
            .mappings()
            .all()
        )
        evs = int(
            (await conn.execute(select(func.count()).where(events.c.run_id.in_(ids)))).scalar_one()
        )
        sts = int(
            (
                await conn.execute(
                    select(func.count()).where(steps.c.run_id.in_(ids), steps.c.output.is_not(None))
                )
            ).scalar_one()
        )
    return [*(dict(r) for r in rows), {"events": evs, "steps_with_output": sts}]


async def test_dry_run_and_real_run_agree_on_10k_finished_runs(
    db: Database, tmp_path: Path
) -> None:
    settings = make_settings(db.url, tmp_path, maintenance_batch_size=500)
    assert (settings.compaction_after_days, settings.archival_after_days) == (7, 30)
    assert settings.audit_retention_days == 90
    now = await db.now()
    s = Seeded()
    # 10,000 finished runs in three age groups, plus live runs that are older than all.
    await _seed(db, s, "archivable", 3000, now=now, finished_days=40, event_days=(40, 40))
    await _seed(
        db, s, "archivable_failed", 1000, now=now, finished_days=41, status="failed",
        event_days=(41,), dead_letter_days=41,
    )  # fmt: skip
    await _seed(db, s, "compactable", 2500, now=now, finished_days=10, event_days=(100, 10))
    await _seed(
        db, s, "compactable_failed", 500, now=now, finished_days=10, status="failed",
        event_days=(100,), dead_letter_days=100,
    )  # fmt: skip
    await _seed(db, s, "recent", 3000, now=now, finished_days=1, steps_per_run=1, event_days=(1,))
    await _seed(db, s, "live", 60, now=now, finished_days=None, status="running", event_days=(300,))
    await _seed(
        db, s, "waiting", 40, now=now, finished_days=None, status="waiting_signal",
        event_days=(300,),
    )  # fmt: skip
    # Finished children of a live parent keep everything: the parent may still read them.
    await _seed(
        db, s, "children_of_live", 10, now=now, finished_days=100, event_days=(100,),
        parent=s.groups["live"][0],
    )  # fmt: skip
    protected = s.groups["recent"] + s.groups["live"] + s.groups["waiting"]
    protected += s.groups["children_of_live"]
    before = await _census(db)
    protected_before = await _run_rows(db, protected)

    dry = await run_maintenance(db, settings, dry_run=True)
    assert await _census(db) == before, "a dry run changed the database"

    real = await run_maintenance(db, settings)
    dry_tiers = [(t.tier, t.batches, t.touched) for t in dry.tiers]
    assert dry_tiers == [(t.tier, t.batches, t.touched) for t in real.tiers]
    touched = {t.tier: t.touched for t in real.tiers}
    assert touched[Tier.COMPACTION] == {
        "runs": 7000,
        "steps": 14000,
        "events": 3000 * 2 + 1000 + 2500 * 2 + 500,
        "signals": 0,
        "approval_decisions": 0,
        "run_logs": 0,
    }
    assert touched[Tier.ARCHIVAL] == {
        "runs": 4000,
        "steps": 8000,
        "events": 7000,
        "signals": 0,
        "approval_decisions": 0,
        "dead_letters": 1000,
        "run_logs": 0,
        "run_labels": 0,
        "event_waits": 0,
    }
    # The other tables' rules (tests/integration/test_retention.py) find nothing here.
    assert touched[Tier.AUDIT] == {
        "events": 3000,
        "dead_letters": 500,
        **dict.fromkeys(qr.report_names(), 0),
    }
    assert [t.batches for t in real.tiers][:2] == [14, 8]  # 500 runs per transaction

    after = await _census(db)
    assert after["runs"] == before["runs"] - 4000
    assert after["archive"] == 4000
    assert after["runs_compacted"] == 3000
    assert after["dead_letters"] == before["dead_letters"] - 1500
    assert await _run_rows(db, protected) == protected_before, "a protected run was touched"

    # Idempotent: a second run finds nothing left to do.
    again = await run_maintenance(db, settings, dry_run=True)
    assert all(n == 0 for t in again.tiers for n in t.touched.values())


async def test_windows_are_exclusive_and_per_tier(db: Database, tmp_path: Path) -> None:
    settings = make_settings(db.url, tmp_path, compaction_after_days=7, archival_after_days=30)
    now = await db.now()
    s = Seeded()
    await _seed(db, s, "just_young", 5, now=now, finished_days=6.9, event_days=(6.9,))
    await _seed(db, s, "just_old", 3, now=now, finished_days=7.1, event_days=(7.1,))
    await _seed(db, s, "archive_young", 2, now=now, finished_days=29.9)
    await _seed(db, s, "archive_old", 4, now=now, finished_days=30.1)
    only_compaction = await run_maintenance(db, settings, tiers=[Tier.COMPACTION], dry_run=True)
    assert [t.tier for t in only_compaction.tiers] == [Tier.COMPACTION]
    assert only_compaction.tiers[0].touched["runs"] == 3 + 2 + 4
    report = await run_maintenance(db, settings, tiers=[Tier.ARCHIVAL, Tier.AUDIT])
    assert [t.tier for t in report.tiers] == [Tier.ARCHIVAL, Tier.AUDIT]
    assert report.tiers[0].touched["runs"] == 4
    assert all(n == 0 for n in report.tiers[1].touched.values())
    async with db.read() as conn:
        archived = set((await conn.execute(select(runs_archive.c.run_id))).scalars())
        compacted = (
            await conn.execute(select(func.count()).where(runs.c.compacted_at.is_not(None)))
        ).scalar_one()
    assert archived == set(s.groups["archive_old"])
    assert compacted == 0  # compaction was not asked for


def test_audit_window_shorter_than_operational_window_is_refused() -> None:
    with pytest.raises(ValueError) as excinfo:
        Settings(dev_secret=DEV_SECRET, compaction_after_days=14, audit_retention_days=7)
    message = str(excinfo.value)
    assert "TREADLE_AUDIT_RETENTION_DAYS" in message
    assert "TREADLE_COMPACTION_AFTER_DAYS" in message
    with pytest.raises(ValueError, match="TREADLE_ARCHIVAL_AFTER_DAYS"):
        Settings(dev_secret=DEV_SECRET, compaction_after_days=14, archival_after_days=7)


@pytest.fixture
async def api(db: Database, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The API in-process (ASGI) on this test's database."""
    app = create_app(make_settings(db.url, tmp_path), db=db, check_schema_on_start=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://treadle") as client:
        yield client


def _auth(tenant: str, *scopes: str) -> dict[str, str]:
    tok = DevTokens(DEV_SECRET).mint(tenant_id=tenant, subject="op", scopes=scopes)
    return {"Authorization": f"Bearer {tok}"}


async def test_reads_of_compacted_and_archived_runs(db: Database, api: httpx.AsyncClient) -> None:
    now = await db.now()
    s = Seeded()
    await _seed(db, s, "compact", 2, now=now, finished_days=10, event_days=(10,))
    await _seed(
        db, s, "compact_failed", 2, now=now, finished_days=10, status="failed",
        dead_letter_days=10,
    )  # fmt: skip
    await _seed(db, s, "archive", 2, now=now, finished_days=40, event_days=(40,))
    reader = _auth("acme", "runs:read", "runs:write")
    admin = _auth("acme", "admin")

    refused = await api.post("/admin/maintenance", json={"dry_run": True}, headers=reader)
    assert refused.status_code == 403
    assert refused.json()["required_scope"] == "admin"
    bad = await api.post("/admin/maintenance", json={"tiers": ["vacuum"]}, headers=admin)
    assert bad.status_code == 422
    only = await api.post(
        "/admin/maintenance", json={"dry_run": True, "tiers": ["archival"]}, headers=admin
    )
    assert only.status_code == 200, only.text
    assert [t["tier"] for t in only.json()["tiers"]] == ["archival"]
    dry = await api.post("/admin/maintenance", json={"dry_run": True}, headers=admin)
    assert dry.status_code == 200, dry.text
    assert dry.json()["dry_run"] is True
    real = await api.post("/admin/maintenance", json={}, headers=admin)
    assert real.status_code == 200
    strip = [{k: v for k, v in t.items() if k != "cutoff"} for t in real.json()["tiers"]]
    assert strip == [{k: v for k, v in t.items() if k != "cutoff"} for t in dry.json()["tiers"]]
    assert real.json()["tiers"][0]["touched"]["runs"] == 6
    assert real.json()["tiers"][1]["touched"]["runs"] == 2

    # Compacted (tenant acme holds the even-numbered runs of each group): payloads null.
    compacted = s.groups["compact"][0]
    got = await api.get(f"/runs/{compacted}", headers=reader)
    assert got.status_code == 200
    body = got.json()
    assert body["status"] == "completed"
    assert body["compacted_at"] is not None
    assert (body["input"], body["output"]) == (None, None)
    steps_page = (await api.get(f"/runs/{compacted}/steps", headers=reader)).json()
    assert [st["output"] for st in steps_page["items"]] == [None, None]
    evs = (await api.get(f"/runs/{compacted}/events", headers=reader)).json()["items"]
    assert [e["data"] for e in evs] == [None]
    text = await api.get(f"/runs/{compacted}/report?format=text", headers=reader)
    assert "compacted" in text.text
    # A compacted failed run cannot be re-run: its input is gone.
    retry = await api.post(
        f"/runs/{s.groups['compact_failed'][0]}/retry", json={"reason": "x"}, headers=admin
    )
    assert retry.status_code == 409
    assert "compacted" in retry.json()["detail"]

    # Archived: 404 with code run_archived and the summary; same for its sub-resources.
    archived = s.groups["archive"][0]
    for path in ("", "/steps", "/events", "/report", "/result"):
        gone = await api.get(f"/runs/{archived}{path}", headers=reader)
        assert gone.status_code == 404, path
        assert gone.json()["code"] == "run_archived"
        assert gone.json()["run_status"] == "completed"
        assert gone.json()["archived_at"]
    # Another tenant's archived run is an ordinary 404: nothing leaks.
    other = await api.get(f"/runs/{s.groups['archive'][1]}", headers=reader)
    assert other.status_code == 404
    assert other.json()["code"] == "run_not_found"


def test_cli_dry_run_then_real_run(tmp_path: Path, sqlite_template: Path) -> None:
    import asyncio
    import shutil

    path = tmp_path / "cli.db"
    shutil.copy(sqlite_template, path)
    url = f"sqlite+aiosqlite:///{path}"

    async def seed() -> None:
        db = Database(make_settings(url, tmp_path))
        try:
            now = await db.now()
            s = Seeded()
            await _seed(db, s, "old", 7, now=now, finished_days=40, event_days=(100,))
            await _seed(db, s, "young", 3, now=now, finished_days=1)
        finally:
            await db.dispose()

    asyncio.run(seed())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env.update({"TREADLE_DATABASE_URL": url, "TREADLE_DATA_DIR": str(tmp_path)})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app.cli.main", "maintenance", "run", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    dry = cli("--dry-run", "--format", "json")
    assert dry.returncode == 0, dry.stderr
    dry_report = json.loads(dry.stdout)
    # Alembic's start-up chatter ("setup plugin ...") only when asked for.
    assert "alembic" not in dry.stderr, dry.stderr
    for command in (["maintenance", "run", "--dry-run"], ["maintenance", "partitions"]):
        quiet = subprocess.run(
            [sys.executable, "-m", "app.cli.main", *command],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert quiet.returncode == 0 and "alembic" not in quiet.stderr, quiet.stderr
    asked = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "maintenance", "partitions"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**env, "TREADLE_LOG_LEVEL": "debug"},
    )  # fmt: skip
    assert asked.returncode == 0 and "alembic.runtime.plugins" in asked.stderr, asked.stderr
    assert dry_report["dry_run"] is True
    text = cli("--tier", "archival", "--dry-run")
    assert "would touch" in text.stdout and "7 runs" in text.stdout, text.stdout
    real = json.loads(cli("--format", "json").stdout)
    assert [t["touched"] for t in real["tiers"]] == [t["touched"] for t in dry_report["tiers"]]
    assert real["tiers"][1]["touched"]["runs"] == 7
    bad = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "maintenance", "run"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**env, "TREADLE_AUDIT_RETENTION_DAYS": "1"},
    )  # fmt: skip
    assert bad.returncode == 2
    assert "TREADLE_AUDIT_RETENTION_DAYS" in bad.stderr
    assert "TREADLE_COMPACTION_AFTER_DAYS" in bad.stderr
