"""``ctx.logger``: lines kept with the run, replay-safe, per attempt, bounded; both databases.

See docs/adr/0027-run-logs.md. The HTTP view (``GET /runs/{run_id}/logs``) is exercised
here through the in-process app; the crash case with real worker processes lives in
tests/acceptance/test_run_logs_http.py.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import BaseModel
from sqlalchemy import func, select, update

from app.core import json
from app.core.errors import LeaseLost
from app.core.settings import Settings
from app.db.database import Database, fetch_now
from app.db.queries import runs as runs_q
from app.db.queries.run_logs import DROPPED_SEQ
from app.db.tables import run_logs, runs
from app.engine import control
from app.engine.executor import RunExecution
from app.engine.maintenance import Tier, run_maintenance
from app.engine.registry import Registry
from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow
from tests.conftest import make_settings
from tests.integration import support

TENANT = "logs-t"
OTHER = "logs-other"
_ids = itertools.count()


class Job(BaseModel):
    key: str
    lines: int = 0


_flaky_calls: dict[str, int] = {}


def flaky(key: str) -> str:
    """Fails its first attempt; logs through ``current_step().logger`` on every attempt."""
    step = current_step()
    step.logger.info("attempt begins", attempt_seen=step.attempt)
    _flaky_calls[key] = _flaky_calls.get(key, 0) + 1
    if _flaky_calls[key] == 1:
        step.logger.error("first attempt fails")
        raise RuntimeError("transient")
    return "ok"


@workflow("logs-wait")
async def logs_wait(ctx: WorkflowContext, job: Job) -> str:
    ctx.logger.info("before the signal", key=job.key)
    got = await ctx.signal("go")
    ctx.logger.warning("after the signal", got=got)
    result = await ctx.step(
        flaky, job.key, name="flaky", retry=RetryPolicy(max_attempts=3, delay=0.1)
    )
    ctx.logger.info("done")
    return str(result)


@workflow("logs-many")
async def logs_many(ctx: WorkflowContext, job: Job) -> int:
    for i in range(job.lines):
        ctx.logger.debug(f"line {i}", i=i)
    # A checkpoint between: lines over the cap are counted in memory (held at most 20),
    # then again by the append (the summary is created, then updated).
    await ctx.now()
    ctx.logger.info("x" * 10_000, big="y" * 10_000)
    ctx.logger.error("odd \x00 nul \ud800 surrogate \u202e rtl 🎉", nul="a\x00b", obj=object())
    return job.lines


REGISTRY = Registry([logs_wait, logs_many])


@pytest.fixture
def lsettings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(
        database_url,
        tmp_path,
        inline_retry_max_seconds=0.0,
        run_log_max_lines=20,
        run_log_max_line_bytes=1000,
    )


async def _lines(db: Database, run_id: Any) -> list[dict[str, Any]]:
    async with db.read() as conn:
        rows = (
            (
                await conn.execute(
                    select(run_logs).where(run_logs.c.run_id == run_id).order_by("seq")
                )
            )
            .mappings()
            .all()
        )
    return [
        {
            "seq": r["seq"],
            "level": r["level"],
            "message": json.loads(r["message"]),
            "fields": json.loads(r["fields"]) if r["fields"] else None,
            "step_id": r["step_id"],
            "attempt": r["attempt"],
        }
        for r in rows
    ]


async def test_replayed_lines_are_kept_once_and_attempts_keep_their_own(
    lsettings: Settings, db: Database
) -> None:
    key = f"k{next(_ids)}"
    run_id = await support.submit(db, lsettings, REGISTRY, TENANT, "logs-wait", key=key)
    with structlog.testing.capture_logs() as records:
        async with support.workers(lsettings, db, REGISTRY):
            await support.reach(db, TENANT, run_id, "waiting_signal")
        # Resumed by another worker (a new execution that replays "before the signal").
        await control.send_signal(
            db, lsettings, tenant_id=TENANT, run_id=run_id, name="go", payload=7, actor="ext"
        )
        async with support.workers(lsettings, db, REGISTRY):
            await support.reach(db, TENANT, run_id, "completed")
    # The worker's own log: each line once too (replays are not forwarded), run id bound.
    forwarded = [r for r in records if r.get("run_id") == str(run_id)]
    assert [r["event"] for r in forwarded].count("before the signal") == 1
    assert [r["event"] for r in forwarded].count("after the signal") == 1
    holding = [r for r in forwarded if r["event"] == "attempt begins"]
    assert [(r["step_id"], r["attempt"], r["log_level"]) for r in holding] == [
        ("flaky", 1, "info"),
        ("flaky", 2, "info"),
    ]
    lines = await _lines(db, run_id)
    assert [(x["message"], x["step_id"], x["attempt"]) for x in lines] == [
        ("before the signal", None, None),
        ("after the signal", None, None),
        ("attempt begins", "flaky", 1),
        ("first attempt fails", "flaky", 1),
        ("attempt begins", "flaky", 2),
        ("done", None, None),
    ]
    assert [x["seq"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert lines[0]["fields"] == {"key": key}
    assert lines[1]["fields"] == {"got": 7} and lines[1]["level"] == "warning"
    assert lines[4]["fields"] == {"attempt_seen": 2}

    # Over HTTP: paging, level and step filters, other tenant and unknown ids.
    async with support.api_client(lsettings, db, TENANT) as client:
        seen: list[str] = []
        token: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 4}
            if token:
                params["page_token"] = token
            resp = await client.get(f"/runs/{run_id}/logs", params=params)
            assert resp.status_code == 200, resp.text
            page = resp.json()
            seen += [i["message"] for i in page["items"]]
            token = page["next_page_token"]
            if not token:
                break
        assert seen == [x["message"] for x in lines]
        resp = await client.get(f"/runs/{run_id}/logs", params={"level": "warning"})
        assert [i["message"] for i in resp.json()["items"]] == [
            "after the signal",
            "first attempt fails",
        ]
        resp = await client.get(f"/runs/{run_id}/logs", params={"step": "flaky"})
        assert [(i["attempt"], i["message"]) for i in resp.json()["items"]] == [
            (1, "attempt begins"),
            (1, "first attempt fails"),
            (2, "attempt begins"),
        ]
        # A token is bound to its filters.
        first = (await client.get(f"/runs/{run_id}/logs", params={"limit": 1})).json()
        resp = await client.get(
            f"/runs/{run_id}/logs",
            params={"limit": 1, "page_token": first["next_page_token"], "level": "error"},
        )
        assert resp.status_code == 400
        assert (
            await client.get(f"/runs/{run_id}/logs", params={"level": "loud"})
        ).status_code == 422
        assert (await client.get("/runs/not-a-uuid/logs")).status_code == 404
        missing = "00000000-0000-4000-8000-000000000000"
        assert (await client.get(f"/runs/{missing}/logs")).status_code == 404
        report = await client.get(f"/runs/{run_id}/report.txt")
        assert "== LOGS (6 lines) ==" in report.text
        assert "warning  after the signal" in report.text
        assert "[flaky#1] first attempt fails" in report.text
    async with support.api_client(lsettings, db, OTHER) as client:
        resp = await client.get(f"/runs/{run_id}/logs")
        assert resp.status_code == 404
        assert resp.json()["code"] == "run_not_found"


async def test_caps_truncation_and_odd_text(lsettings: Settings, db: Database) -> None:
    run_id = await support.submit(
        db, lsettings, REGISTRY, TENANT, "logs-many", key=f"k{next(_ids)}", lines=25
    )
    async with support.workers(lsettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "completed")
    lines = await _lines(db, run_id)
    # 20 kept (the cap), 25 + 2 - 20 = 7 dropped and summarised last.
    assert len(lines) == 21
    assert [x["message"] for x in lines[:20]] == [f"line {i}" for i in range(20)]
    summary = lines[-1]
    assert summary["seq"] == DROPPED_SEQ and summary["level"] == "warning"
    assert summary["message"].startswith("7 lines dropped")
    assert summary["fields"] == {"dropped": 7}

    # Bounds and odd text, on a run with room for them.
    bounded = lsettings.model_copy(update={"run_log_max_lines": 1000})
    run_id = await support.submit(
        db, bounded, REGISTRY, TENANT, "logs-many", key=f"k{next(_ids)}", lines=0
    )
    async with support.workers(bounded, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "completed")
    big, odd = await _lines(db, run_id)
    assert big["message"] == "x" * 1000 + "… [9000 more characters]"
    assert big["fields"]["_truncated"] is True and big["fields"]["_bytes"] > 10_000
    assert odd["message"] == "odd \x00 nul \ud800 surrogate \u202e rtl 🎉"
    assert odd["fields"]["nul"] == "a\x00b"
    assert odd["fields"]["obj"].startswith("<object object")
    async with support.api_client(bounded, db, TENANT) as client:
        items = (await client.get(f"/runs/{run_id}/logs")).json()["items"]
        assert items[1]["message"] == odd["message"]
        text = (await client.get(f"/runs/{run_id}/report.txt")).text
        assert "odd \\u0000 nul \\ud800 surrogate \\u202e rtl 🎉" in text


async def test_a_lost_lease_cannot_append(lsettings: Settings, db: Database) -> None:
    run_id = await support.submit(
        db, lsettings, REGISTRY, TENANT, "logs-many", key=f"k{next(_ids)}"
    )
    async with db.write() as conn:
        (claimed,) = await runs_q.claim_runs(
            conn, worker_id="w1", definition_keys=[("logs-many", "1")], limit=1, lease_ttl=30
        )
    ex = RunExecution(db, lsettings, claimed, logs_many, [], "w1")
    ex.logbook.info("from a worker that is about to lose its lease")
    # Another worker takes the run over: the fence moves on.
    async with db.write() as conn:
        await conn.execute(
            update(runs).where(runs.c.run_id == run_id).values(fence=runs.c.fence + 1)
        )

    with pytest.raises(LeaseLost):
        await ex.journal.flush()  # the execution's last write: only the line rides on it
    async with db.read() as conn:
        count = (
            await conn.execute(
                select(func.count()).select_from(run_logs).where(run_logs.c.run_id == run_id)
            )
        ).scalar_one()
    assert count == 0


async def test_a_line_logged_again_after_a_crash_is_kept_once(
    lsettings: Settings, db: Database
) -> None:
    # After the run's last journaled point, a line is appended by the execution's final
    # write; if the worker dies before the run's next checkpoint, the next execution logs
    # it again at the same position: its origin is taken, so nothing is appended.
    run_id = await support.submit(
        db, lsettings, REGISTRY, TENANT, "logs-many", key=f"k{next(_ids)}"
    )
    async with db.write() as conn:
        (claimed,) = await runs_q.claim_runs(
            conn, worker_id="w1", definition_keys=[("logs-many", "1")], limit=1, lease_ttl=30
        )
    for _ in range(2):
        ex = RunExecution(db, lsettings, claimed, logs_many, [], "w1")
        ex.logbook.info("after the last checkpoint", n=1)
        ex.logbook.info("after the last checkpoint", n=2)
        await ex.journal.flush()
    lines = await _lines(db, run_id)
    assert [(x["seq"], x["fields"]) for x in lines] == [(1, {"n": 1}), (2, {"n": 2})]


async def test_a_redacted_run_shows_no_messages(lsettings: Settings, db: Database) -> None:
    key = f"k{next(_ids)}"
    run_id = await support.submit(db, lsettings, REGISTRY, TENANT, "logs-wait", key=key)
    async with support.workers(lsettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "waiting_signal")
    async with db.write() as conn:
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == run_id)
            .values(status="failed", reason="failure_authorization")
        )
    async with support.api_client(lsettings, db, TENANT) as client:
        page = (await client.get(f"/runs/{run_id}/logs")).json()
        assert page["redacted"] is True
        assert [(i["level"], i["message"], i["fields"]) for i in page["items"]] == [
            ("info", None, None)
        ]
        text = (await client.get(f"/runs/{run_id}/report.txt")).text
        assert key not in text and "before the signal" not in text
        assert "(message withheld: run redacted)" in text


async def test_retention_deletes_a_runs_lines(lsettings: Settings, db: Database) -> None:
    ids = []
    for _ in range(2):
        run_id = await support.submit(
            db, lsettings, REGISTRY, TENANT, "logs-many", key=f"k{next(_ids)}", lines=3
        )
        ids.append(run_id)
    async with support.workers(lsettings, db, REGISTRY):
        for run_id in ids:
            await support.reach(db, TENANT, run_id, "completed")
    assert [len(await _lines(db, r)) for r in ids] == [5, 5]
    # One run finished past the compaction window only, the other past archival too.
    async with db.write() as conn:
        now = await fetch_now(conn, db.dialect)
        for run_id, days in zip(ids, (lsettings.compaction_after_days + 1, 10_000), strict=True):
            await conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id)
                .values(finished_at=now - timedelta(days=days))
            )
    archived = await run_maintenance(db, lsettings, tiers=[Tier.ARCHIVAL])
    assert archived.tiers[0].touched["runs"] == 1
    assert archived.tiers[0].touched["run_logs"] == 5
    assert [len(await _lines(db, r)) for r in ids] == [5, 0]
    compacted = await run_maintenance(db, lsettings, tiers=[Tier.COMPACTION])
    assert compacted.tiers[0].touched["run_logs"] == 5
    assert [len(await _lines(db, r)) for r in ids] == [0, 0]
