"""One journal, two dialects: the same scripted executions leave the same rows.

Every fenced write of a leased run goes through ``app/engine/journal.py``; PostgreSQL
takes single self-fencing statements where it can, SQLite multi-statement transactions
(``app/db/queries/checkpoints.commit``). These tests run the same workflows with a real
in-process worker on a fresh PostgreSQL database and a fresh SQLite file, then compare
what the journal left: steps, the timeline (kinds in order, with their data), each run's
final status, reason, output and error, and dead letters. Ids, times, worker ids and the
retry jitter (derived from the run id) are normalised away; everything else must match.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import or_, select, update

from app.core import json
from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import dead_letters, events, run_logs, runs, steps
from app.engine import control
from app.engine.registry import Registry
from app.sdk import Permanent, RetryPolicy, WorkflowContext, workflow
from app.sdk.context import current_step
from tests.conftest import make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "parity"
FAST = RetryPolicy(max_attempts=3, backoff="fixed", delay=0.01)


class Empty(BaseModel):
    pass


def double(n: int) -> int:
    return n * 2


def flaky(n: int) -> int:
    # Fails its first attempt only: one retry schedule, then a result.
    if current_step().attempt == 1:
        raise ConnectionError("first attempt always fails")
    return n + 1


def broken(n: int) -> int:
    raise ValueError(f"broken on {n}")


def refuse(n: int) -> int:
    raise Permanent(f"refused {n}")


def reserve(what: str) -> str:
    return f"reserved {what}"


def unreserve(result: str) -> str:
    return f"undone {result}"


@workflow("parity-plain")
async def plain(ctx: WorkflowContext, _: Empty) -> dict[str, Any]:
    a = await ctx.step(double, 2)
    # A ctx.patched marker rides on the next write.
    b = await ctx.step(double, a) if ctx.patched("second-double") else a
    ctx.logger.info("after the steps", a=a, b=b)
    return {"a": a, "b": b}


@workflow("parity-retry")
async def retried(ctx: WorkflowContext, _: Empty) -> int:
    return await ctx.step(flaky, 1, retry=FAST)


@workflow("parity-dead")
async def dead(ctx: WorkflowContext, _: Empty) -> int:
    return await ctx.step(broken, 7, retry=RetryPolicy(max_attempts=2, delay=0.01))


@workflow("parity-undo")
async def undo(ctx: WorkflowContext, _: Empty) -> None:
    await ctx.step(reserve, "flight", name="flight", compensate=unreserve)
    await ctx.step(refuse, 3)


@workflow("parity-waits")
async def waits(ctx: WorkflowContext, _: Empty) -> Any:
    await ctx.sleep(0.05)  # inline: shorter than TREADLE_INLINE_RETRY_MAX_SECONDS
    got = await ctx.signal("go")
    return {"got": got}


@workflow("parity-kid")
async def kid(ctx: WorkflowContext, _: Empty) -> Any:
    return await ctx.signal("go")


@workflow("parity-parent")
async def parent(ctx: WorkflowContext, _: Empty) -> Any:
    out = await ctx.child(kid, {})
    return {"child": out}


REGISTRY = Registry([plain, retried, dead, undo, waits, kid, parent])

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?")
# Values that differ between two executions of the same script for reasons unrelated to
# what was written: which worker, which id, and the retry delay (jittered by the run id).
_VOLATILE = {"worker_id", "retry_in_seconds", "signal_id", "lag_seconds", "traceback"}


def _norm(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ("<v>" if k in _VOLATILE and v is not None else _norm(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, str):
        return _TIME.sub("<time>", _UUID.sub("<id>", value))
    return value


def _text(text: str | None) -> Any:
    return None if text is None else _norm(json.loads(text))


async def snapshot(db: Database, root: uuid.UUID) -> dict[str, Any]:
    """The journal rows a run (and its children) left, normalised, keyed by workflow."""
    out: dict[str, Any] = {}
    async with db.read() as conn:
        tree = (
            (
                await conn.execute(
                    select(runs).where(or_(runs.c.run_id == root, runs.c.parent_run_id == root))
                )
            )
            .mappings()
            .all()
        )
        for run in tree:
            run_id = run["run_id"]
            step_rows = (
                (
                    await conn.execute(
                        select(steps).where(steps.c.run_id == run_id).order_by(steps.c.seq)
                    )
                )
                .mappings()
                .all()
            )
            event_rows = (
                (
                    await conn.execute(
                        select(events).where(events.c.run_id == run_id).order_by(events.c.event_id)
                    )
                )
                .mappings()
                .all()
            )
            letters = (
                (await conn.execute(select(dead_letters).where(dead_letters.c.run_id == run_id)))
                .mappings()
                .all()
            )
            lines = (
                (
                    await conn.execute(
                        select(run_logs).where(run_logs.c.run_id == run_id).order_by(run_logs.c.id)
                    )
                )
                .mappings()
                .all()
            )
            out[run["workflow"]] = {
                "run": {
                    "status": run["status"],
                    "reason": run["reason"],
                    "output": _text(run["output"]),
                    "error": _text(run["error"]),
                    "attempt": run["attempt"],
                    "lease_owner": run["lease_owner"],
                },
                "steps": [
                    {
                        "seq": s["seq"],
                        "step_id": s["step_id"],
                        "kind": s["kind"],
                        "name": s["name"],
                        "status": s["status"],
                        "attempt": s["attempt"],
                        "max_attempts": s["max_attempts"],
                        "output": _text(s["output"]),
                        "error": _text(s["error"]),
                        "detail": _text(s["detail"]),
                        "has_deadline": s["deadline"] is not None,
                        "finished": s["finished_at"] is not None,
                    }
                    for s in step_rows
                ],
                "events": [
                    (e["kind"], e["step_id"], e["actor"], _text(e["data"])) for e in event_rows
                ],
                "dead_letters": [
                    (d["workflow"], d["reason"], d["status"], _text(d["error"])) for d in letters
                ],
                "logs": [
                    (x["seq"], x["origin"], x["level"], _text(x["message"]), _text(x["fields"]))
                    for x in lines
                ],
            }
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two snapshots differ, one line per differing leaf (empty when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        found: list[str] = []
        for key in sorted(set(a) | set(b), key=str):
            found += differences(a.get(key), b.get(key), f"{path}/{key}")
        return found
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        found = [f"{path}: {len(a)} vs {len(b)} items"] if len(a) != len(b) else []
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found += differences(x, y, f"{path}[{i}]")
        return found
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


async def _signal_when_waiting(db: Database, settings: Settings, run_id: uuid.UUID) -> None:
    await support.reach(db, TENANT, run_id, "waiting_signal", timeout=60)
    await control.send_signal(
        db, settings, tenant_id=TENANT, run_id=run_id, name="go", payload={"n": 5}, actor="op"
    )


async def _child_of(db: Database, parent_id: uuid.UUID) -> uuid.UUID:
    async def probe() -> uuid.UUID | None:
        async with db.read() as conn:
            found: uuid.UUID | None = (
                await conn.execute(select(runs.c.run_id).where(runs.c.parent_run_id == parent_id))
            ).scalar_one_or_none()
        return found

    return await wait_for(probe, timeout=60, what="the child run")


SCRIPTS: dict[str, Callable[[Database, Settings, uuid.UUID], Any] | None] = {
    "parity-plain": None,
    "parity-retry": None,
    "parity-dead": None,
    "parity-undo": None,
    "parity-waits": _signal_when_waiting,
    "parity-parent": None,
}


async def run_scripts(settings: Settings) -> dict[str, Any]:
    """Run every script once with a real worker; the normalised rows of each."""
    db = Database(settings)
    try:
        taken: dict[str, Any] = {}
        async with support.workers(settings, db, REGISTRY):
            for name, drive in SCRIPTS.items():
                run_id = await support.submit(db, settings, REGISTRY, TENANT, name)
                if drive is not None:
                    await drive(db, settings, run_id)
                if name == "parity-parent":
                    await support.reach(db, TENANT, run_id, "waiting_child", timeout=60)
                    await _signal_when_waiting(db, settings, await _child_of(db, run_id))
                await support.reach(
                    db, TENANT, run_id, "completed", "failed", "compensated", timeout=60
                )
                taken[name] = await snapshot(db, run_id)
        return taken
    finally:
        await db.dispose()


def _sqlite_settings(tmp_path: Path, sqlite_template: Path) -> Settings:
    path = tmp_path / "parity.db"
    shutil.copy(sqlite_template, path)
    return make_settings(f"sqlite+aiosqlite:///{path}", tmp_path / "sqlite")


async def test_postgresql_and_sqlite_leave_the_same_journal(
    tmp_path: Path, sqlite_template: Path, make_pg_database: Callable[[], str]
) -> None:
    pg = await run_scripts(make_settings(make_pg_database(), tmp_path / "pg"))
    lite = await run_scripts(_sqlite_settings(tmp_path, sqlite_template))
    # The scripts did what they say (so equality below is about something).
    assert pg["parity-plain"]["parity-plain"]["run"]["output"] == {"a": 4, "b": 8}
    assert [x[3] for x in pg["parity-plain"]["parity-plain"]["logs"]] == ["after the steps"]
    assert pg["parity-retry"]["parity-retry"]["run"]["output"] == 2
    assert [e[0] for e in pg["parity-retry"]["parity-retry"]["events"]].count(
        "step_retry_scheduled"
    ) == 1
    assert pg["parity-dead"]["parity-dead"]["run"]["status"] == "failed"
    assert len(pg["parity-dead"]["parity-dead"]["dead_letters"]) == 1
    assert pg["parity-undo"]["parity-undo"]["run"]["status"] == "compensated"
    assert pg["parity-waits"]["parity-waits"]["run"]["output"] == {"got": {"n": 5}}
    assert "run_released" in [e[0] for e in pg["parity-waits"]["parity-waits"]["events"]]
    assert pg["parity-parent"]["parity-parent"]["run"]["output"] == {"child": {"n": 5}}
    assert pg["parity-parent"]["parity-kid"]["run"]["status"] == "completed"
    assert differences(pg, lite) == []


async def test_a_deliberately_different_write_is_caught(
    tmp_path: Path, sqlite_template: Path
) -> None:
    # The comparison is only worth something if it fails: the same script on two SQLite
    # databases matches, and one write made differently in one of them is reported.
    settings = _sqlite_settings(tmp_path, sqlite_template)
    first = await run_scripts(settings)
    other = tmp_path / "other"
    other.mkdir()
    second_settings = _sqlite_settings(other, sqlite_template)
    second = await run_scripts(second_settings)
    assert differences(first, second) == []
    db = Database(second_settings)
    try:
        async with db.write() as conn:
            # As if the retry's schedule had been journaled as a timeout instead.
            await conn.execute(
                update(events)
                .where(events.c.kind == "step_retry_scheduled")
                .values(kind="step_timed_out")
            )
        async with db.read() as conn:
            root = (
                await conn.execute(select(runs.c.run_id).where(runs.c.workflow == "parity-retry"))
            ).scalar_one()
        second["parity-retry"] = await snapshot(db, root)
    finally:
        await db.dispose()
    found = differences(first, second)
    assert found, "a changed event kind went unnoticed"
    assert all("parity-retry/parity-retry/events" in line for line in found), found
    assert any("step_retry_scheduled" in line and "step_timed_out" in line for line in found)
