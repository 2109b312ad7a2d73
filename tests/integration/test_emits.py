"""``ctx.emit``: ordered, bounded, replay-safe, per attempt; both databases and the test kit.

See docs/adr/0028-live-event-streams.md. The live stream over HTTP with worker processes
(and a worker killed mid-run) lives in tests/acceptance/test_event_stream.py.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.core import json
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import events as events_q
from app.engine import control
from app.engine.emitter import encode_emit
from app.engine.registry import Registry
from app.sdk import EmitRefused, RetryPolicy, WorkflowContext, current_step, workflow
from app.sdk.testing import WorkflowTestEnv
from tests.conftest import make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "emit-t"
_ids = itertools.count()


class Job(BaseModel):
    key: str
    n: int = 0


_calls: dict[str, int] = {}
_gates: dict[str, threading.Event] = {}


def tokens(key: str, n: int, ctx: WorkflowContext) -> str:
    """A sync step (worker thread) that emits ``n`` tokens; its first attempt fails."""
    _calls[key] = _calls.get(key, 0) + 1
    for i in range(n):
        ctx.emit("token", {"i": i, "attempt": current_step().attempt})
    if _calls[key] == 1:
        raise RuntimeError("transient")
    return "done"


async def slow(key: str, ctx: WorkflowContext) -> int:
    """An async step whose first emit is written while it still runs (it waits on a gate)."""
    ctx.emit("progress", 1)
    gate = _gates[key]
    while not gate.is_set():
        await asyncio.sleep(0.01)
    ctx.emit("progress", 2)
    return 2


@workflow("emit-replay")
async def emit_replay(ctx: WorkflowContext, job: Job) -> str:
    ctx.emit("stage", "before signal")
    got = await ctx.signal("go")
    ctx.emit("stage", {"after": got})
    out = await ctx.step(tokens, job.key, job.n, ctx, retry=RetryPolicy(max_attempts=3, delay=0.1))
    ctx.emit("stage", "end")
    return out


@workflow("emit-live")
async def emit_live(ctx: WorkflowContext, job: Job) -> int:
    return await ctx.step(slow, job.key, ctx)


@workflow("emit-bounds")
async def emit_bounds(ctx: WorkflowContext, job: Job) -> list[str]:
    seen: list[str] = []
    for bad in ("x" * 2_000, float("nan"), {1, 2}):
        try:
            ctx.emit("bad", bad)
        except EmitRefused as exc:
            seen.append(str(exc)[:80])
    for name in ("", "a\nb", "n" * 101):
        try:
            ctx.emit(name, 1)
        except EmitRefused:
            seen.append("name")
    for i in range(job.n):
        try:
            ctx.emit("count", i)
        except EmitRefused as exc:
            seen.append(str(exc))
            break
    return seen


async def booked(tx: AsyncSession, ctx: WorkflowContext) -> str:
    """A transactional step that emits while its transaction is open."""
    ctx.emit("tx", "inside")
    await tx.execute(text("SELECT 1"))
    return "booked"


@workflow("emit-tx")
async def emit_tx(ctx: WorkflowContext, job: Job) -> str:
    return await ctx.transaction(booked, ctx)


REGISTRY = Registry([emit_replay, emit_live, emit_bounds, emit_tx])


@pytest.fixture
def esettings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(
        database_url,
        tmp_path,
        inline_retry_max_seconds=0.0,
        emit_max_bytes=1000,
        emit_max_per_run=5,
    )


async def _emitted(db: Database, run_id: Any) -> list[dict[str, Any]]:
    async with db.read() as conn:
        rows = await events_q.list_events(conn, TENANT, run_id, after_id=None, limit=10_000)
    ids = [r["event_id"] for r in rows]
    assert ids == sorted(ids)
    return [
        {"step_id": r["step_id"], **(json.loads(r["data"]) or {})}
        for r in rows
        if r["kind"] == "emitted"
    ]


async def test_replays_emit_nothing_again_and_attempts_emit_their_own(
    esettings: Settings, db: Database
) -> None:
    key = f"k{next(_ids)}"
    settings = esettings.model_copy(update={"emit_max_per_run": 100})
    run_id = await support.submit(db, settings, REGISTRY, TENANT, "emit-replay", key=key, n=2)
    async with support.workers(settings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "waiting_signal")
    await control.send_signal(
        db, settings, tenant_id=TENANT, run_id=run_id, name="go", payload=7, actor="ext"
    )
    # A new execution replays "before signal"; the step fails once and is retried after a
    # release (inline retries are off), so the body replays a third time.
    async with support.workers(settings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "completed")
    got = [(e["step_id"], e["name"], e["data"], e["attempt"]) for e in await _emitted(db, run_id)]
    assert got == [
        (None, "stage", "before signal", None),
        (None, "stage", {"after": 7}, None),
        ("tokens", "token", {"i": 0, "attempt": 1}, 1),
        ("tokens", "token", {"i": 1, "attempt": 1}, 1),
        ("tokens", "token", {"i": 0, "attempt": 2}, 2),
        ("tokens", "token", {"i": 1, "attempt": 2}, 2),
        (None, "stage", "end", None),
    ]
    # Timeline order: a step's emits come after its attempt started and before its result.
    async with db.read() as conn:
        rows = await events_q.list_events(conn, TENANT, run_id, after_id=None, limit=10_000)
    kinds = [(r["kind"], r["step_id"]) for r in rows if r["step_id"] == "tokens"]
    assert kinds == [
        ("step_started", "tokens"),
        ("emitted", "tokens"),
        ("emitted", "tokens"),
        ("step_retry_scheduled", "tokens"),
        ("step_started", "tokens"),
        ("emitted", "tokens"),
        ("emitted", "tokens"),
        ("step_succeeded", "tokens"),
    ]


async def test_a_step_emit_is_written_while_the_step_runs(
    esettings: Settings, db: Database
) -> None:
    key = f"k{next(_ids)}"
    _gates[key] = threading.Event()
    run_id = await support.submit(db, esettings, REGISTRY, TENANT, "emit-live", key=key)
    async with support.workers(esettings, db, REGISTRY):

        async def first() -> list[dict[str, Any]] | None:
            found = await _emitted(db, run_id)
            return found or None

        # The step is still blocked on its gate: the emit is in the database already.
        found = await wait_for(first, timeout=20, what="the first emit, mid-step")
        assert [e["data"] for e in found] == [1]
        _gates[key].set()
        await support.reach(db, TENANT, run_id, "completed")
    assert [e["data"] for e in await _emitted(db, run_id)] == [1, 2]


async def test_bounds_refuse_with_a_clear_error_and_keep_nothing(
    esettings: Settings, db: Database
) -> None:
    run_id = await support.submit(db, esettings, REGISTRY, TENANT, "emit-bounds", key="b", n=9)
    async with support.workers(esettings, db, REGISTRY):
        row = await support.reach(db, TENANT, run_id, "completed")
    seen = json.loads(row["output"])
    assert "over TREADLE_EMIT_MAX_BYTES=1000" in seen[0]
    assert "not JSON" in seen[1] and "not JSON" in seen[2]
    assert seen[3:6] == ["name", "name", "name"]
    assert seen[6] == "run keeps 5 emits, TREADLE_EMIT_MAX_PER_RUN=5"
    assert [e["data"] for e in await _emitted(db, run_id)] == [0, 1, 2, 3, 4]


async def test_an_emit_inside_a_transactional_step_is_written_beside_it(
    esettings: Settings, db: Database
) -> None:
    run_id = await support.submit(db, esettings, REGISTRY, TENANT, "emit-tx", key="t")
    async with support.workers(esettings, db, REGISTRY):
        await support.reach(db, TENANT, run_id, "completed", timeout=60)
    assert [(e["step_id"], e["data"], e["attempt"]) for e in await _emitted(db, run_id)] == [
        ("booked", "inside", 1)
    ]


def test_encode_keeps_odd_unicode_as_ascii_json() -> None:
    text = encode_emit("tok", "nul \x00 rtl \u202e 🎉", 3, 1000)
    assert text.isascii()
    assert json.loads(text) == {"name": "tok", "data": "nul \x00 rtl \u202e 🎉", "attempt": 3}
    with pytest.raises(EmitRefused, match="not JSON"):
        encode_emit("tok", "lone \ud800", None, 1000)


async def test_the_test_kit_records_emits() -> None:
    key = f"k{next(_ids)}"
    async with WorkflowTestEnv([emit_replay]) as env:
        run = await env.start(emit_replay, Job(key=key, n=1))
        await env.signal(run, "go", "yes")
        assert await env.result(run) == "done"
        emits = await env.emits(run)
    assert [(e.name, e.data, e.step_id, e.attempt) for e in emits] == [
        ("stage", "before signal", None, None),
        ("stage", {"after": "yes"}, None, None),
        ("token", {"i": 0, "attempt": 1}, "tokens", 1),
        ("token", {"i": 0, "attempt": 2}, "tokens", 2),
        ("stage", "end", None, None),
    ]
