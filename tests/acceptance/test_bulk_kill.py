"""A bulk cancel over real HTTP survives ``kill -9`` of its worker with exact counts.

``treadle serve`` plus ``treadle worker`` subprocesses (tests/acceptance/conftest.py). 2,000
runs are cancelled by a label filter in chunks of 10; the worker processing the batch is
SIGKILLed once some but not all are done, a second worker takes the batch over when the
lease expires, and the batch completes with ``done + skipped + failed == matched`` and
exactly one ``run_cancelled`` event per run.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select

from app.core.labels import validate_labels
from app.db.database import Database
from app.db.tables import batch_items, events
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import WorkflowContext, workflow
from tests.acceptance.conftest import Stack, cli, cli_run, token
from tests.conftest import make_settings
from tests.helpers import wait_for_sync

RUNS = 2000
PRE_CANCELLED = 10


class Job(BaseModel):
    n: int


# Registered by this test only: the stack's workers do not run it, so its runs stay
# queued until the batch cancels them.
@workflow("bulk-idle")
async def idle(ctx: WorkflowContext, job: Job) -> Any:
    return await ctx.signal("never")


async def _seed(database_url: str, tmp: Path, tag: str) -> list[uuid.UUID]:
    settings = make_settings(database_url, tmp)
    db = Database(settings)
    try:
        async with db.write() as conn:
            await Registry([idle]).register(conn)
        submitter = Submitter(db, settings)
        ids = []
        for n in range(RUNS):
            row, _ = await submitter.submit(
                SubmitRequest(
                    workflow="bulk-idle", input={"n": n}, labels=validate_labels({"tag": tag})
                ),
                tenant_id="acme",
                subject="alice",
            )
            ids.append(row["run_id"])
        return ids
    finally:
        await db.dispose()


async def _audit(database_url: str, tmp: Path, batch_id: str) -> tuple[dict[int, int], int]:
    """Runs by their number of ``run_cancelled`` events, and items without an outcome."""
    db = Database(make_settings(database_url, tmp))
    try:
        async with db.read() as conn:
            per_run = (
                select(events.c.run_id, func.count().label("n"))
                .where(
                    events.c.kind == "run_cancelled",
                    events.c.run_id.in_(
                        select(batch_items.c.run_id).where(
                            batch_items.c.batch_id == uuid.UUID(batch_id)
                        )
                    ),
                )
                .group_by(events.c.run_id)
                .subquery()
            )
            rows = await conn.execute(select(per_run.c.n, func.count()).group_by(per_run.c.n))
            histogram = {int(n): int(k) for n, k in rows.all()}
            open_items = await conn.execute(
                select(func.count())
                .select_from(batch_items)
                .where(
                    batch_items.c.batch_id == uuid.UUID(batch_id),
                    batch_items.c.outcome.is_(None),
                )
            )
            return histogram, int(open_items.scalar_one())
    finally:
        await db.dispose()


def test_bulk_cancel_survives_kill_9_with_exact_counts(stack: Stack, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ids = asyncio.run(_seed(stack.database_url, tmp_path / "seed", tag))
    env = {"TREADLE_BATCH_CHUNK_SIZE": "10"}
    doomed = stack.start_worker(extra_env=env)
    with stack.client() as c:
        for run_id in ids[:PRE_CANCELLED]:
            assert c.post(f"/runs/{run_id}/cancel", json={}).status_code == 200
        flt = {"filter": {"labels": {"tag": tag}}}
        dry = c.post("/runs:cancel", json={**flt, "dry_run": True}).json()
        assert dry["matched"] == RUNS
        resp = c.post("/runs:cancel", json={**flt, "reason": "kill -9 drill"})
        assert resp.status_code == 202, resp.text
        batch_id = resp.json()["batch_id"]

        def midway() -> dict[str, Any] | None:
            b = c.get(f"/batches/{batch_id}").json()
            return b if 0 < b["done"] < RUNS - PRE_CANCELLED else None

        before = wait_for_sync(midway, timeout=120, interval=0.01, what="batch mid-way")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        at_kill = c.get(f"/batches/{batch_id}").json()
        assert at_kill["state"] == "running", at_kill
        assert at_kill["done"] + at_kill["skipped"] < RUNS, at_kill
        stack.start_worker(extra_env=env)

        def finished() -> dict[str, Any] | None:
            b = c.get(f"/batches/{batch_id}").json()
            return b if b["state"] != "running" else None

        final = wait_for_sync(finished, timeout=300, interval=0.2, what="batch completed")
    assert final["state"] == "completed", final
    assert final["matched"] == RUNS
    assert final["done"] + final["skipped"] + final["failed"] == final["matched"], final
    assert (final["done"], final["skipped"], final["failed"]) == (
        RUNS - PRE_CANCELLED,
        PRE_CANCELLED,
        0,
    ), final
    assert final["skipped_reasons"] == {"already_terminal": PRE_CANCELLED}
    assert before["done"] <= at_kill["done"] <= final["done"]
    histogram, open_items = asyncio.run(_audit(stack.database_url, tmp_path / "audit", batch_id))
    # Every run cancelled exactly once: by the early single cancels or by the batch.
    assert histogram == {1: RUNS}, histogram
    assert open_items == 0


def test_cli_bulk_verbs_and_batches(stack: Stack) -> None:
    tag = uuid.uuid4().hex[:8]
    stack.start_worker()
    env = {**stack.env, "TREADLE_URL": stack.url, "TREADLE_TOKEN": token()}
    with stack.client() as c:
        ids = []
        for _ in range(3):
            resp = c.post(
                "/runs", json={"workflow": "acc-hold", "input": {"name": tag}, "labels": {"t": tag}}
            )
            assert resp.status_code == 201, resp.text
            ids.append(resp.json()["run_id"])
    dry = json.loads(
        cli(env, "runs", "bulk-cancel", "--label", f"t={tag}", "--dry-run", "-o", "json")
    )
    assert dry["matched"] == 3 and sorted(dry["sample"]) == sorted(ids)
    done = json.loads(
        cli(
            env,
            "runs",
            "bulk-cancel",
            "--label",
            f"t={tag}",
            "--reason",
            "cli",
            "--wait",
            "-o",
            "json",
        )
    )
    assert (done["state"], done["matched"], done["done"]) == ("completed", 3, 3), done
    shown = json.loads(cli(env, "batches", "show", done["batch_id"], "-o", "json"))
    assert shown["batch_id"] == done["batch_id"] and shown["reason"] == "cli"
    listed = json.loads(cli(env, "batches", "list", "-o", "json"))
    assert [b["batch_id"] for b in listed["items"]] == [done["batch_id"]]
    # A completed batch cannot be cancelled: the API's 409 is an error exit.
    refused = cli_run(env, "batches", "cancel", done["batch_id"])
    assert refused.returncode != 0 and "completed" in refused.stderr, refused
    # Bad usage is refused before any request: both ids and filters, or neither.
    for args in (["runs", "bulk-pause"], ["runs", "bulk-pause", ids[0], "--label", "t=x"]):
        bad = cli_run(env, *args)
        assert bad.returncode == 2, bad
    with stack.client() as c:
        for run_id in ids:
            assert c.get(f"/runs/{run_id}").json()["status"] == "cancelled"
