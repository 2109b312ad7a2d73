"""Bulk actions as durable batches on both databases.

Ids and filters, dry run, skipped reasons, tenant isolation, batch cancel and a lease
takeover with exact counts.

Batches are processed by :class:`BatchRunner` directly (the worker's own loop object), so
each step is deterministic; tests/acceptance/test_bulk_kill.py covers real worker
processes killed mid-batch.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from prometheus_client import REGISTRY as METRICS
from pydantic import BaseModel
from sqlalchemy import func, select

from app.api.app import create_app
from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES, Scope
from app.core.errors import LeaseLost
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.tables import events
from app.engine import batches as engine
from app.engine.batches import BatchRunner
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.conftest import DEV_SECRET, make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "bulk"
OTHER = "bulk-other"


class Job(BaseModel):
    key: str


@workflow("bulk-wait")
async def waits(ctx: WorkflowContext, job: Job) -> Any:
    return await ctx.signal("go")


@workflow("bulk-owned", access="owner")
async def owned(ctx: WorkflowContext, job: Job) -> Any:
    return await ctx.signal("go")


REGISTRY = Registry([waits, owned])


async def start(client: httpx.AsyncClient, labels: dict[str, str]) -> uuid.UUID:
    resp = await client.post(
        "/runs", json={"workflow": "bulk-wait", "input": {"key": "k"}, "labels": labels}
    )
    assert resp.status_code == 201, resp.text
    return uuid.UUID(resp.json()["run_id"])


async def registered(db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)


async def status_of(db: Database, tenant: str, run_id: uuid.UUID) -> str:
    async with db.read() as conn:
        return str((await runs_q.get_run(conn, tenant, run_id))["status"])


async def drain(db: Database, settings: Settings) -> None:
    """Process every running batch to its end with one runner."""
    runner = BatchRunner(db, settings, worker_id="test-runner")
    while await runner.run_once():
        pass


def metric(action: str, outcome: str) -> float:
    value = METRICS.get_sample_value(
        "treadle_batch_items_total", {"action": action, "outcome": outcome}
    )
    return value or 0.0


async def cancel_events(db: Database, run_id: uuid.UUID) -> int:
    async with db.read() as conn:
        found = await conn.execute(
            select(func.count())
            .select_from(events)
            .where(events.c.run_id == run_id, events.c.kind == "run_cancelled")
        )
        return int(found.scalar_one())


async def test_bulk_cancel_by_filter_and_ids_dry_run_and_tenants(
    settings: Settings, db: Database
) -> None:
    await registered(db)
    async with (
        support.api_client(settings, db, TENANT) as client,
        support.api_client(settings, db, OTHER) as other,
    ):
        mine = [await start(client, {"customer": "42"}) for _ in range(5)]
        seven = await start(client, {"customer": "7"})
        theirs = [await start(other, {"customer": "42"}) for _ in range(2)]
        # One is cancelled beforehand: the batch skips it as already terminal.
        resp = await client.post(f"/runs/{mine[0]}/cancel", json={"reason": "early"})
        assert resp.status_code == 200, resp.text

        flt = {"filter": {"labels": {"customer": "42"}}}
        dry = await client.post("/runs:cancel", json={**flt, "dry_run": True})
        assert dry.status_code == 200, dry.text
        assert dry.json()["matched"] == 5
        assert sorted(dry.json()["sample"]) == sorted(str(r) for r in mine)
        listed = await client.get("/batches")
        assert listed.json()["items"] == []  # a dry run creates nothing

        before = metric("cancel", "done"), metric("cancel", "skipped")
        resp = await client.post("/runs:cancel", json={**flt, "reason": "INC-1"})
        assert resp.status_code == 202, resp.text
        batch = resp.json()
        assert resp.headers["location"] == f"/batches/{batch['batch_id']}"
        assert (batch["state"], batch["matched"], batch["done"]) == ("running", 5, 0)
        await drain(db, settings)
        got = (await client.get(f"/batches/{batch['batch_id']}")).json()
        assert got["state"] == "completed"
        assert (got["matched"], got["done"], got["skipped"], got["failed"]) == (5, 4, 1, 0)
        assert got["skipped_reasons"] == {"already_terminal": 1}
        assert (metric("cancel", "done"), metric("cancel", "skipped")) == (
            before[0] + 4,
            before[1] + 1,
        )
        assert got["created_by"] == "t"
        assert got["finished_at"] is not None
        assert got["selection"] == flt
        for run_id in mine:
            assert await status_of(db, TENANT, run_id) == "cancelled"
            assert await cancel_events(db, run_id) == 1
        assert await status_of(db, TENANT, seven) == "queued"
        for run_id in theirs:
            assert await status_of(db, OTHER, run_id) == "queued"

        # By ids: another tenant's run and an unknown id are not found, never touched.
        ids = [str(theirs[0]), str(seven), str(uuid.uuid4())]
        dry = await client.post("/runs:cancel", json={"run_ids": ids, "dry_run": True})
        assert dry.json() == {"dry_run": True, "matched": 1, "sample": [str(seven)]}
        resp = await client.post("/runs:cancel", json={"run_ids": ids})
        assert resp.status_code == 202, resp.text
        await drain(db, settings)
        got = (await client.get(f"/batches/{resp.json()['batch_id']}")).json()
        assert (got["matched"], got["done"], got["skipped"]) == (3, 1, 2)
        assert got["skipped_reasons"] == {"not_found": 2}
        assert await status_of(db, TENANT, seven) == "cancelled"
        assert await status_of(db, OTHER, theirs[0]) == "queued"
        # The other tenant sees none of these batches, and cannot read or cancel one.
        assert (await other.get("/batches")).json()["items"] == []
        assert (await other.get(f"/batches/{got['batch_id']}")).status_code == 404
        assert (await other.post(f"/batches/{got['batch_id']}/cancel")).status_code == 404
        page = (await client.get("/batches", params={"limit": 1})).json()
        assert len(page["items"]) == 1 and page["next_page_token"]
        rest = await client.get(
            "/batches", params={"limit": 1, "page_token": page["next_page_token"]}
        )
        assert rest.json()["items"][0]["batch_id"] == batch["batch_id"]


async def test_bulk_pause_unpause_signal_skipped_reasons(settings: Settings, db: Database) -> None:
    await registered(db)
    async with support.api_client(settings, db, TENANT) as client:
        runs = [await start(client, {"team": "a"}) for _ in range(3)]
        resp = await client.post(
            "/runs:pause", json={"run_ids": [str(r) for r in runs[:2]], "reason": "bank down"}
        )
        assert resp.status_code == 202, resp.text
        await drain(db, settings)
        assert (await client.get(f"/batches/{resp.json()['batch_id']}")).json()["done"] == 2
        resp = await client.post("/runs:pause", json={"run_ids": [str(runs[0])]})
        await drain(db, settings)
        got = (await client.get(f"/batches/{resp.json()['batch_id']}")).json()
        assert got["skipped_reasons"] == {"already_paused": 1}

        resp = await client.post("/runs:unpause", json={"filter": {"labels": {"team": "a"}}})
        await drain(db, settings)
        got = (await client.get(f"/batches/{resp.json()['batch_id']}")).json()
        assert (got["matched"], got["done"], got["skipped"]) == (3, 2, 1)
        assert got["skipped_reasons"] == {"not_paused": 1}

        # A signal batch buffers the signal on each live run; a finished run is skipped.
        await client.post(f"/runs/{runs[2]}/cancel", json={})
        resp = await client.post(
            "/runs:signal",
            json={"filter": {"labels": {"team": "a"}}, "name": "go", "payload": {"n": 1}},
        )
        assert resp.status_code == 202, resp.text
        await drain(db, settings)
        got = (await client.get(f"/batches/{resp.json()['batch_id']}")).json()
        assert got["params"] == {"name": "go", "payload": {"n": 1}}
        assert (got["done"], got["skipped_reasons"]) == (2, {"already_terminal": 1})
        resp = await client.post("/runs:resume", json={"run_ids": [str(runs[0])]})
        await drain(db, settings)
        got = (await client.get(f"/batches/{resp.json()['batch_id']}")).json()
        assert got["skipped_reasons"] == {"not_waiting": 1}  # queued, not waiting
        resp = await client.post("/runs:retry", json={"run_ids": [str(runs[0])]})
        await drain(db, settings)
        got = (await client.get(f"/batches/{resp.json()['batch_id']}")).json()
        assert got["skipped_reasons"] == {"not_failed": 1}


async def test_bulk_bad_input_is_refused_and_creates_nothing(
    settings: Settings, db: Database
) -> None:
    await registered(db)
    async with support.api_client(settings, db, TENANT) as client:
        run_id = str(await start(client, {}))
        cases: list[dict[str, Any]] = [
            {},
            {"run_ids": [run_id], "filter": {"workflow": "bulk-wait"}},
            {"run_ids": []},
            {"run_ids": [str(uuid.uuid4()) for _ in range(1001)]},
            {"run_ids": ["not-a-uuid"]},
            {"filter": {"colour": "red"}},
            {"filter": {"created_after": "2026-01-01T00:00:00"}},  # no time zone
            {"filter": {"labels": {"bad key!": "x"}}},
            {"filter": {"status": "sleeping"}},
            {"run_ids": [run_id], "surprise": 1},
        ]
        for body in cases:
            resp = await client.post("/runs:cancel", json=body)
            assert resp.status_code == 422, (body, resp.text)
            assert resp.headers["content-type"].startswith("application/problem+json")
        resp = await client.post("/runs:signal", json={"run_ids": [run_id]})  # no name
        assert resp.status_code == 422
        assert (await client.get("/batches")).json()["items"] == []
        assert await status_of(db, TENANT, uuid.UUID(run_id)) == "queued"
        assert (await client.get("/batches/nope")).status_code == 404
        assert (await client.get(f"/batches/{uuid.uuid4()}")).status_code == 404


async def test_filter_over_the_limit_is_refused(database_url: str, tmp_path: Any) -> None:
    settings = make_settings(database_url, tmp_path, batch_max_runs=2)
    db = Database(settings)
    try:
        await registered(db)
        async with support.api_client(settings, db, TENANT) as client:
            for _ in range(3):
                await start(client, {"x": "1"})
            resp = await client.post("/runs:cancel", json={"filter": {"labels": {"x": "1"}}})
            assert resp.status_code == 422, resp.text
            assert "TREADLE_BATCH_MAX_RUNS" in resp.json()["detail"]
            assert (await client.get("/batches")).json()["items"] == []
    finally:
        await db.dispose()


async def test_cancel_a_batch_stops_it(database_url: str, tmp_path: Any) -> None:
    settings = make_settings(database_url, tmp_path, batch_chunk_size=2)
    db = Database(settings)
    try:
        await registered(db)
        async with support.api_client(settings, db, TENANT) as client:
            runs = [await start(client, {"c": "1"}) for _ in range(5)]
            batch_id = (
                await client.post("/runs:cancel", json={"filter": {"labels": {"c": "1"}}})
            ).json()["batch_id"]
            runner = BatchRunner(db, settings, worker_id="w")
            claimed = await runner.claim()
            assert claimed is not None
            first = await engine.process_chunk(
                db, settings, batch_id=claimed["batch_id"], fence=claimed["fence"], worker_id="w"
            )
            assert first.done == 2 and not first.finished
            resp = await client.post(f"/batches/{batch_id}/cancel")
            assert resp.status_code == 200, resp.text
            assert resp.json()["state"] == "cancelled"
            again = await client.post(f"/batches/{batch_id}/cancel")
            assert again.status_code == 200  # idempotent
            after = await engine.process_chunk(
                db, settings, batch_id=claimed["batch_id"], fence=claimed["fence"], worker_id="w"
            )
            assert after.stopped and after.done == 0
            got = (await client.get(f"/batches/{batch_id}")).json()
            assert (got["state"], got["done"], got["matched"]) == ("cancelled", 2, 5)
            statuses = [await status_of(db, TENANT, r) for r in runs]
            assert sorted(statuses) == ["cancelled"] * 2 + ["queued"] * 3
            # A completed batch cannot be cancelled.
            done_id = (await client.post("/runs:pause", json={"run_ids": [str(runs[4])]})).json()[
                "batch_id"
            ]
            await drain(db, settings)
            assert (await client.post(f"/batches/{done_id}/cancel")).status_code == 409
    finally:
        await db.dispose()


async def test_expired_lease_is_taken_over_with_exact_counts(
    database_url: str, tmp_path: Any
) -> None:
    settings = make_settings(
        database_url,
        tmp_path,
        batch_chunk_size=3,
        lease_ttl_seconds=1.0,
        heartbeat_interval_seconds=0.2,
    )
    db = Database(settings)
    try:
        await registered(db)
        async with support.api_client(settings, db, TENANT) as client:
            runs = [await start(client, {"t": "1"}) for _ in range(7)]
            await client.post(f"/runs/{runs[1]}/cancel", json={})
            batch_id = (
                await client.post("/runs:cancel", json={"filter": {"labels": {"t": "1"}}})
            ).json()["batch_id"]
            a = BatchRunner(db, settings, worker_id="a")
            held = await a.claim()
            assert held is not None
            await engine.process_chunk(
                db, settings, batch_id=held["batch_id"], fence=held["fence"], worker_id="a"
            )
            # "a" stops heartbeating (it died); "b" takes over once the lease expires.
            b = BatchRunner(db, settings, worker_id="b")
            taken = await wait_for(b.claim, timeout=30, what="lease taken over")
            assert taken["fence"] == held["fence"] + 1
            assert taken["cursor"] is not None
            try:
                await engine.process_chunk(
                    db, settings, batch_id=held["batch_id"], fence=held["fence"], worker_id="a"
                )
                raise AssertionError("a stale fence committed a chunk")
            except LeaseLost:
                pass
            await b.run_batch(taken)
            got = (await client.get(f"/batches/{batch_id}")).json()
            assert got["state"] == "completed"
            assert (got["matched"], got["done"], got["skipped"], got["failed"]) == (7, 6, 1, 0)
            for run_id in runs:
                assert await cancel_events(db, run_id) == 1
    finally:
        await db.dispose()


@contextlib.asynccontextmanager
async def user_client(
    settings: Settings, db: Database, subject: str
) -> AsyncIterator[httpx.AsyncClient]:
    """A non-admin caller (every scope but ``admin``): the owner policy applies to it."""
    app = create_app(settings, db=db, check_schema_on_start=False)
    scopes = frozenset(s for s in ALL_SCOPES if s is not Scope.ADMIN)
    tok = DevTokens(DEV_SECRET).mint(tenant_id=TENANT, subject=subject, scopes=scopes)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://test",
        headers={"Authorization": f"Bearer {tok}"},
    ) as client:
        yield client


async def test_owner_policy_runs_of_another_subject_are_not_found(
    settings: Settings, db: Database
) -> None:
    await registered(db)
    async with (
        user_client(settings, db, "alice") as alice,
        user_client(settings, db, "bob") as bob,
    ):
        resp = await alice.post(
            "/runs", json={"workflow": "bulk-owned", "input": {"key": "a"}, "labels": {"o": "1"}}
        )
        assert resp.status_code == 201, resp.text
        hers = uuid.UUID(resp.json()["run_id"])
        mine = await start(bob, {"o": "1"})
        dry = (
            await bob.post("/runs:cancel", json={"filter": {"labels": {"o": "1"}}, "dry_run": True})
        ).json()
        assert (dry["matched"], dry["sample"]) == (1, [str(mine)])
        by_filter = await bob.post("/runs:cancel", json={"filter": {"labels": {"o": "1"}}})
        by_ids = await bob.post("/runs:pause", json={"run_ids": [str(hers)]})
        await drain(db, settings)
        got = (await bob.get(f"/batches/{by_filter.json()['batch_id']}")).json()
        assert (got["matched"], got["done"]) == (1, 1)
        got = (await bob.get(f"/batches/{by_ids.json()['batch_id']}")).json()
        assert got["skipped_reasons"] == {"not_found": 1}
        run = (await alice.get(f"/runs/{hers}")).json()
        assert run["status"] == "queued" and run["paused_at"] is None
