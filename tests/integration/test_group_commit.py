"""Group commit (app/db/group_commit.py): many runs' checkpoints in one statement.

On PostgreSQL one worker process's plain checkpoints (a step's start and result, a bare
completion) issued in the same moment go out as one multi-row statement per kind, each
row fenced on its own. These tests pin that: concurrent runs on one worker share batches
and leave the rows a one-by-one journal leaves; a stale fence among good rows fails only
its own caller with ``LeaseLost``; a batch statement that fails is re-run row by row so
each caller gets its own outcome; SQLite and a negative window never batch.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import RowMapping, select

from app.core.errors import LeaseLost
from app.core.settings import Settings
from app.db import group_commit
from app.db.database import Database
from app.db.queries import checkpoints as checkpoints_q
from app.db.queries import runs as runs_q
from app.db.tables import events, runs, steps
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.conftest import WITH_PGBOUNCER, make_settings
from tests.integration import support

TENANT = "gc"


class In(BaseModel):
    """Empty input."""


def add_one(n: int) -> int:
    return n + 1


@workflow("gc-chain")
async def chain(ctx: WorkflowContext, _: In) -> int:
    """Five plain steps in a row: ten checkpoints and a completion."""
    n = 0
    for _i in range(5):
        n = await ctx.step(add_one, n)
    return n


@workflow("gc-idle")
async def idle(ctx: WorkflowContext, _: In) -> None:
    """Never executed: the batcher tests drive the checkpoints themselves."""


async def _claimed(db: Database, settings: Settings, count: int) -> list[RowMapping]:
    registry = Registry([idle])
    for _ in range(count):
        await support.submit(db, settings, registry, TENANT, "gc-idle")
    async with db.write() as conn:
        claimed = await runs_q.claim_runs(
            conn,
            worker_id="w1",
            definition_keys=[("gc-idle", "1")],
            limit=count,
            lease_ttl=30,
        )
    assert len(claimed) == count
    return list(claimed)


def _start(run: RowMapping, step_id: str = "s") -> dict[str, Any]:
    return {
        "run_id": run["run_id"],
        "tenant_id": run["tenant_id"],
        "fence": int(run["fence"]),
        "step_id": step_id,
        "seq": 0,
        "kind": "step",
        "name": step_id,
        "attempt": 1,
        "max_attempts": 3,
        "detail": None,
        "started_at": None,
        "event_data": '{"attempt":1}',
    }


def _committer(db: Database) -> group_commit.GroupCommitter:
    # Window 0: everything submitted before the loop's next turn is one batch.
    return group_commit.GroupCommitter(db.autocommit_retrying, window_seconds=0, max_rows=64)


async def _steps(db: Database, run_id: uuid.UUID) -> list[tuple[str, str, int]]:
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(steps.c.step_id, steps.c.status, steps.c.fence)
                .where(steps.c.run_id == run_id)
                .order_by(steps.c.step_id)
            )
        ).all()
    return [(r[0], r[1], int(r[2])) for r in rows]


async def _event_kinds(db: Database, run_id: uuid.UUID) -> list[str]:
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(events.c.kind).where(events.c.run_id == run_id).order_by(events.c.event_id)
            )
        ).all()
    return [r[0] for r in rows]


async def _bump_fence(db: Database, run_id: uuid.UUID) -> None:
    # Another worker claimed the run (its lease expired, say): the fence moved on.
    async with db.write() as conn:
        await conn.execute(
            runs.update().where(runs.c.run_id == run_id).values(fence=runs.c.fence + 1)
        )


def _pg_only(db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("group commit is the PostgreSQL path")


@WITH_PGBOUNCER
async def test_whole_attempts_batch_with_their_start_time_and_events_in_order(
    settings: Settings, db: Database
) -> None:
    """``step_done`` rows (start and result at once, ADR 0040) of many runs, one stale.

    Every held row is written ``succeeded`` with the attempt's own start time (capped at
    the database's now), its ``step_started`` before its ``step_succeeded``, its run's
    lost claims reset; the stale row gets ``LeaseLost`` and writes nothing.
    """
    from datetime import UTC, datetime, timedelta

    _pg_only(db)
    claimed = await _claimed(db, settings, 4)
    async with db.write() as conn:
        await conn.execute(
            runs.update()
            .where(runs.c.run_id.in_([r["run_id"] for r in claimed]))
            .values(lost_claims=2)
        )
    stale = claimed[1]
    await _bump_fence(db, stale["run_id"])
    began = datetime.now(UTC) - timedelta(seconds=5)
    future = datetime.now(UTC) + timedelta(hours=1)  # a worker clock ahead of the database's
    gc = _committer(db)
    outcomes = await asyncio.gather(
        *(
            gc.submit(
                group_commit.STEP_DONE,
                {
                    **_start(r),
                    "output": f'"{i}"',
                    "started_at": future if i == 3 else began,
                    "started_data": '{"attempt":1,"worker_id":"w"}',
                },
            )
            for i, r in enumerate(claimed)
        ),
        return_exceptions=True,
    )
    assert (gc.batches, gc.largest, gc.fallbacks) == (1, 4, 0)
    assert isinstance(outcomes[1], LeaseLost)
    assert [o for i, o in enumerate(outcomes) if i != 1] == [False] * 3  # committed, not paused
    async with db.read() as conn:
        for i, r in enumerate(claimed):
            got = (
                await conn.execute(
                    select(
                        steps.c.status, steps.c.output, steps.c.started_at, steps.c.finished_at
                    ).where(steps.c.run_id == r["run_id"])
                )
            ).all()
            timeline = (
                await conn.execute(
                    select(events.c.kind, events.c.at)
                    .where(events.c.run_id == r["run_id"], events.c.step_id == "s")
                    .order_by(events.c.event_id)
                )
            ).all()
            lost = (
                await conn.execute(select(runs.c.lost_claims).where(runs.c.run_id == r["run_id"]))
            ).scalar_one()
            if r is stale:
                assert (got, timeline, lost) == ([], [], 2)
                continue
            ((status, output, started, finished_at),) = got
            assert (status, output, lost) == ("succeeded", f'"{i}"', 0)
            assert started <= finished_at
            if i != 3:
                assert abs((started - began).total_seconds()) < 0.001
            assert [k for k, _ in timeline] == ["step_started", "step_succeeded"]
            assert timeline[0][1] == started and timeline[0][1] <= timeline[1][1]


@WITH_PGBOUNCER
async def test_last_steps_with_completions_batch_like_their_single_form(
    settings: Settings, db: Database
) -> None:
    """``complete_with_step`` rows (a last step held for the outcome, ADR 0047), one stale.

    The batch and the single statement leave the same rows: the step ``succeeded`` with
    its output, ``step_started``, ``step_succeeded`` and ``run_completed`` in that order,
    the run ``completed`` with its own output and no lease, lost claims reset, one
    webhook delivery per matching endpoint. The stale row gets ``LeaseLost`` and writes
    nothing at all.
    """
    from datetime import UTC, datetime, timedelta

    from app.db.tables import webhook_deliveries, webhook_endpoints

    _pg_only(db)
    claimed = await _claimed(db, settings, 5)
    async with db.write() as conn:
        await conn.execute(
            runs.update()
            .where(runs.c.run_id.in_([r["run_id"] for r in claimed]))
            .values(lost_claims=1)
        )
        await conn.execute(
            webhook_endpoints.insert().values(
                endpoint_id=uuid.uuid4(),
                tenant_id=TENANT,
                url="https://example.invalid/hook",
                events=",completed,",
                workflow=None,
                secret="whsec_dGVzdA==",
                created_by="t",
                created_at=datetime.now(UTC),
            )
        )
    stale = claimed[1]
    await _bump_fence(db, stale["run_id"])
    began = datetime.now(UTC) - timedelta(seconds=2)

    def row(i: int, r: RowMapping) -> dict[str, Any]:
        return {
            **_start(r),
            "output": f'"step {i}"',
            "started_at": began,
            "started_data": '{"attempt":1,"worker_id":"w"}',
            "run_output": f'"run {i}"',
        }

    gc = _committer(db)
    batched = claimed[:4]
    outcomes = await asyncio.gather(
        *(gc.submit(group_commit.COMPLETE_WITH_STEP, row(i, r)) for i, r in enumerate(batched)),
        return_exceptions=True,
    )
    assert (gc.batches, gc.largest, gc.fallbacks) == (1, 4, 0)
    assert isinstance(outcomes[1], LeaseLost)
    assert [o for i, o in enumerate(outcomes) if i != 1] == [False] * 3
    async with db.autocommit() as conn:
        assert not await checkpoints_q.complete_with_step(conn, **row(4, claimed[4]))

    async def state(r: RowMapping) -> tuple[Any, ...]:
        async with db.read() as conn:
            run = (
                await conn.execute(
                    select(
                        runs.c.status, runs.c.output, runs.c.lease_owner, runs.c.lost_claims
                    ).where(runs.c.run_id == r["run_id"])
                )
            ).one()
            journal = (
                await conn.execute(
                    select(steps.c.step_id, steps.c.status, steps.c.output, steps.c.attempt).where(
                        steps.c.run_id == r["run_id"]
                    )
                )
            ).all()
            deliveries = (
                await conn.execute(
                    select(webhook_deliveries.c.run_status).where(
                        webhook_deliveries.c.run_id == r["run_id"]
                    )
                )
            ).all()
        return (tuple(run), [tuple(j) for j in journal], [d[0] for d in deliveries])

    for i, r in enumerate(claimed):
        got = await state(r)
        kinds = await _event_kinds(db, r["run_id"])
        if r is stale:
            assert got == (("running", None, "w1", 1), [], [])
            assert "step_started" not in kinds and "run_completed" not in kinds
            continue
        assert got == (
            ("completed", f'"run {i}"', None, 0),
            [("s", "succeeded", f'"step {i}"', 1)],
            ["completed"],
        )
        assert kinds[-3:] == ["step_started", "step_succeeded", "run_completed"]


@WITH_PGBOUNCER
async def test_stale_fence_fails_only_its_own_row(settings: Settings, db: Database) -> None:
    _pg_only(db)
    claimed = await _claimed(db, settings, 5)
    gc = _committer(db)
    await asyncio.gather(*(gc.submit(group_commit.START_ATTEMPT, _start(r)) for r in claimed))
    assert (gc.batches, gc.largest) == (1, 5)
    for r in claimed:
        assert await _steps(db, r["run_id"]) == [("s", "running", int(r["fence"]))]

    stale = claimed[2]
    await _bump_fence(db, stale["run_id"])
    outcomes = await asyncio.gather(
        *(
            gc.submit(
                group_commit.RECORD_SUCCESS,
                {
                    "run_id": r["run_id"],
                    "tenant_id": r["tenant_id"],
                    "fence": int(r["fence"]),
                    "step_id": "s",
                    "output": "1",
                    "event_data": '{"attempt":1}',
                },
            )
            for r in claimed
        ),
        return_exceptions=True,
    )
    assert gc.batches == 2 and gc.fallbacks == 0
    assert isinstance(outcomes[2], LeaseLost) and outcomes[2].run_id == stale["run_id"]
    assert [o for i, o in enumerate(outcomes) if i != 2] == [False] * 4
    for r in claimed:
        fence = int(r["fence"])
        if r is stale:
            assert await _steps(db, r["run_id"]) == [("s", "running", fence)]
            assert (await _event_kinds(db, r["run_id"]))[-1] == "step_started"
        else:
            assert await _steps(db, r["run_id"]) == [("s", "succeeded", fence)]
            assert (await _event_kinds(db, r["run_id"]))[-2:] == [
                "step_started",
                "step_succeeded",
            ]

    # Completions: the stale run stays running, the others complete with their output.
    outcomes = await asyncio.gather(
        *(
            gc.submit(
                group_commit.COMPLETE_RUN,
                {
                    "run_id": r["run_id"],
                    "tenant_id": r["tenant_id"],
                    "fence": int(r["fence"]),
                    "output": "7",
                },
            )
            for r in claimed
        ),
        return_exceptions=True,
    )
    assert gc.batches == 3
    assert isinstance(outcomes[2], LeaseLost)
    async with db.read() as conn:
        rows = {
            row[0]: (row[1], row[2], row[3])
            for row in (
                await conn.execute(
                    select(runs.c.run_id, runs.c.status, runs.c.output, runs.c.lease_owner).where(
                        runs.c.run_id.in_([r["run_id"] for r in claimed])
                    )
                )
            ).all()
        }
    for r in claimed:
        if r is stale:
            assert rows[r["run_id"]][0] == "running"
        else:
            assert rows[r["run_id"]] == ("completed", "7", None)
            assert (await _event_kinds(db, r["run_id"]))[-1] == "run_completed"


async def test_each_row_learns_whether_its_own_run_is_paused(
    settings: Settings, db: Database
) -> None:
    """A step's result reads its run's ``paused_at`` under the row lock (ADR 0044).

    Batched and alone, every held row reports its own run's pause, written by an
    operator while the attempt ran; the result is still journaled (a pause moves no
    fence), and a run's completion reports no pause.
    """
    _pg_only(db)
    claimed = await _claimed(db, settings, 4)
    paused = claimed[1]["run_id"]
    async with db.write() as conn:
        await runs_q.set_pause(conn, run_id=paused, paused_by="op", reason="look")
    gc = _committer(db)

    def success(r: RowMapping, step_id: str) -> dict[str, Any]:
        return {
            "run_id": r["run_id"],
            "tenant_id": r["tenant_id"],
            "fence": int(r["fence"]),
            "step_id": step_id,
            "output": "1",
            "event_data": '{"attempt":1}',
        }

    await asyncio.gather(*(gc.submit(group_commit.START_ATTEMPT, _start(r)) for r in claimed))
    news = await asyncio.gather(
        *(gc.submit(group_commit.RECORD_SUCCESS, success(r, "s")) for r in claimed)
    )
    assert gc.largest == 4
    assert news == [False, True, False, False]
    assert await _steps(db, paused) == [("s", "succeeded", int(claimed[1]["fence"]))]

    # Alone (a batch of one is the single statement), and through the single forms.
    await gc.submit(group_commit.START_ATTEMPT, {**_start(claimed[1], "t"), "seq": 1})
    assert await gc.submit(group_commit.RECORD_SUCCESS, success(claimed[1], "t")) is True
    async with db.autocommit() as conn:
        assert await checkpoints_q.record_success(conn, **success(claimed[0], "s")) is False
        assert await checkpoints_q.record_success(conn, **success(claimed[1], "s")) is True
    done = {
        "run_id": claimed[1]["run_id"],
        "tenant_id": claimed[1]["tenant_id"],
        "fence": int(claimed[1]["fence"]),
        "output": "1",
    }
    assert await gc.submit(group_commit.COMPLETE_RUN, done) is False


@WITH_PGBOUNCER
async def test_a_row_of_another_tenant_matches_nothing(settings: Settings, db: Database) -> None:
    """Right run id and fence but another tenant: that row's caller gets ``LeaseLost``.

    Every table of a batch is matched on ``(tenant_id, run_id)``
    (docs/adr/0034-tenant-leading-keys.md); the other rows of the batch are written.
    """
    _pg_only(db)
    claimed = await _claimed(db, settings, 3)
    wrong = claimed[1]
    gc = _committer(db)
    for kind in (group_commit.START_ATTEMPT, group_commit.COMPLETE_RUN):
        rows = [
            {**_start(r), "tenant_id": "elsewhere" if r is wrong else r["tenant_id"]}
            if kind is group_commit.START_ATTEMPT
            else {
                "run_id": r["run_id"],
                "tenant_id": "elsewhere" if r is wrong else r["tenant_id"],
                "fence": int(r["fence"]),
                "output": "1",
            }
            for r in claimed
        ]
        outcomes = await asyncio.gather(*(gc.submit(kind, p) for p in rows), return_exceptions=True)
        assert isinstance(outcomes[1], LeaseLost), outcomes
        assert [o for i, o in enumerate(outcomes) if i != 1] == [False, False]
    assert gc.fallbacks == 0
    assert await _steps(db, wrong["run_id"]) == []
    assert "run_completed" not in await _event_kinds(db, wrong["run_id"])
    for r in claimed:
        if r is not wrong:
            assert (await _event_kinds(db, r["run_id"]))[-1] == "run_completed"


async def test_failed_batch_gives_each_caller_its_own_outcome(
    settings: Settings, db: Database
) -> None:
    _pg_only(db)
    claimed = await _claimed(db, settings, 3)
    stale = claimed[2]
    await _bump_fence(db, stale["run_id"])
    gc = _committer(db)
    # The same step twice in one batch: ON CONFLICT DO UPDATE cannot touch one row twice
    # in one statement (a cardinality violation), so the batch fails as a whole; row by
    # row, both starts are written, and the stale fence fails only its own caller.
    rows = [_start(claimed[0]), _start(claimed[0]), _start(claimed[1]), _start(stale)]
    outcomes = await asyncio.gather(
        *(gc.submit(group_commit.START_ATTEMPT, p) for p in rows), return_exceptions=True
    )
    assert (gc.batches, gc.largest, gc.fallbacks) == (1, 4, 1)
    assert outcomes[:3] == [False, False, False]
    assert isinstance(outcomes[3], LeaseLost)
    assert await _steps(db, claimed[0]["run_id"]) == [("s", "running", int(claimed[0]["fence"]))]
    assert (await _event_kinds(db, claimed[0]["run_id"])).count("step_started") == 2
    assert await _steps(db, claimed[1]["run_id"]) == [("s", "running", int(claimed[1]["fence"]))]
    assert await _steps(db, stale["run_id"]) == []


async def test_concurrent_runs_on_one_worker_share_commits(
    settings: Settings, db: Database
) -> None:
    _pg_only(db)
    registry = Registry([chain])
    run_ids = [await support.submit(db, settings, registry, TENANT, "gc-chain") for _ in range(24)]
    async with support.workers(settings, db, registry, concurrency=16):
        for run_id in run_ids:
            row = await support.reach(db, TENANT, run_id, "completed", "failed")
            assert (row["status"], row["output"]) == ("completed", "5")
    gc = group_commit.committer(db)
    assert gc.largest > 1, "no two checkpoints ever shared a commit"
    assert gc.rows > gc.batches
    for run_id in run_ids:
        rows = await _steps(db, run_id)
        assert [(s, st) for s, st, _ in rows] == [(s, "succeeded") for s, _, _ in rows] and len(
            rows
        ) == 5
        kinds = await _event_kinds(db, run_id)
        assert kinds.count("step_started") == 5 and kinds.count("step_succeeded") == 5
        assert kinds[-1] == "run_completed"


async def test_sqlite_and_a_negative_window_never_batch(database_url: str, tmp_path: Path) -> None:
    # SQLite with the defaults; PostgreSQL with the window negative (group commit off).
    off = {} if database_url.startswith("sqlite") else {"group_commit_window_ms": -1}
    settings = make_settings(database_url, tmp_path, **off)
    db = Database(settings)
    try:
        registry = Registry([chain])
        run_ids = [
            await support.submit(db, settings, registry, TENANT, "gc-chain") for _ in range(4)
        ]
        async with support.workers(settings, db, registry, concurrency=4):
            for run_id in run_ids:
                row = await support.reach(db, TENANT, run_id, "completed", "failed")
                assert (row["status"], row["output"]) == ("completed", "5")
        assert not group_commit.enabled(db)
        assert getattr(db, "_group_committer", None) is None
    finally:
        await db.dispose()
