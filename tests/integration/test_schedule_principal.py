"""Schedules act for their creator, on both databases (issue: authorization on every path).

A schedule records the principal that created it (subject, API key, access policy); the
runs it starts carry it, and every fire re-checks it: a revoked key's (or suspended
tenant's) ticks, cron, buffered and manual alike, start nothing and are recorded
``failed`` with why, counted by ``treadle_schedule_fires_refused_total``. An owner-policy
workflow's schedule is its creator's alone over HTTP (404 for colleagues on every
schedule endpoint, absent from their lists), and a colleague cannot re-point a tenant
schedule at an owner-policy workflow. Children of an owner-policy run are owner-policy.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client import REGISTRY as METRICS
from pydantic import BaseModel
from sqlalchemy import RowMapping, select

from app.api.app import create_app
from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES, Scope
from app.core.settings import Settings
from app.core.status import RunStatus
from app.db.database import Database
from app.db.queries import schedules as sched_q
from app.db.tables import runs
from app.engine import control
from app.engine import schedules as engine
from app.engine.api_keys import ApiKeyService, subject_of
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.engine.tenants import TenantService
from app.sdk import WorkflowContext, workflow
from tests.conftest import DEV_SECRET
from tests.integration.support import reach, workers

TENANT = "acme"
T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)


class Inp(BaseModel):
    n: int = 0


@workflow("sp-tenant")
async def sp_tenant(ctx: WorkflowContext, inp: Inp) -> int:
    return inp.n


@workflow("sp-owned", access="owner")
async def sp_owned(ctx: WorkflowContext, inp: Inp) -> int:
    return inp.n


@workflow("sp-parent", access="owner")
async def sp_parent(ctx: WorkflowContext, inp: Inp) -> str:
    await ctx.child(sp_tenant, Inp(n=1))
    return await ctx.start_child(sp_tenant, Inp(n=2))


REGISTRY = Registry([sp_tenant, sp_owned, sp_parent])


def _refused(cause: str) -> float:
    value = METRICS.get_sample_value("treadle_schedule_fires_refused_total", {"cause": cause})
    return value or 0.0


async def _setup(db: Database, settings: Settings) -> Submitter:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    return Submitter(db, settings)


async def _runs(db: Database) -> list[RowMapping]:
    async with db.read() as conn:
        return list((await conn.execute(select(runs).order_by(runs.c.run_id))).mappings())


async def _fires(db: Database, schedule_id: uuid.UUID) -> list[RowMapping]:
    async with db.read() as conn:
        rows = await sched_q.list_fires(conn, TENANT, schedule_id, before_tick=None, limit=1000)
    return sorted(rows, key=lambda r: r["tick"])


async def test_a_revoked_keys_schedule_stops_on_every_fire_path(
    settings: Settings, db: Database
) -> None:
    submitter = await _setup(db, settings)
    keys = ApiKeyService(db)
    key = await keys.create(tenant_id=TENANT, name="cron", scopes=["runs:write"], created_by="op")
    principal = await keys.verify(key.token)
    sched = await engine.create_schedule(
        db,
        submitter,
        engine.ScheduleSpec(
            name="k",
            workflow="sp-owned",
            cron="* * * * *",
            overlap=engine.Overlap.BUFFER_ONE,
            catchup_window_seconds=3600,
        ),
        tenant_id=TENANT,
        subject=principal.subject,
        api_key_id=principal.api_key_id,
        now=T0,
    )
    sid = sched["schedule_id"]
    assert sched["api_key_id"] == principal.api_key_id and sched["access"] == "owner"
    clock = engine.VirtualClock(T0)
    loop = engine.Scheduler(db, settings, clock=clock)
    clock.advance(60)
    assert (await loop.run_once()).started == 1
    # The run acts for the key: same subject, same key, the owner policy.
    (first,) = await _runs(db)
    assert first["created_by"] == subject_of(key.row) == principal.subject
    assert first["api_key_id"] == principal.api_key_id
    assert first["access"] == "owner"
    clock.advance(60)
    assert (await loop.run_once()).buffered == 1  # held back behind the open run

    await keys.revoke(tenant_id=TENANT, key_id=principal.api_key_id, actor="op")
    before = _refused("api_key_revoked")
    # The buffered tick is released once the open run ends: refused, not started.
    await control.cancel(db, tenant_id=TENANT, run_id=first["run_id"], actor="op", reason="t")
    clock.advance(60)
    done = await loop.run_once()
    assert done.started == 0 and done.failed == 2, done  # the buffered tick and the new one
    # A manual trigger (by anyone) starts nothing either.
    fire = await engine.trigger_now(
        db, submitter, tenant_id=TENANT, schedule_id=sid, actor="root", now=clock.current
    )
    assert fire.outcome == engine.FireOutcome.FAILED and fire.run_id is None
    assert fire.error is not None and "revoked" in fire.error
    assert len(await _runs(db)) == 1
    failed = [f for f in await _fires(db, sid) if f["outcome"] == "failed"]
    assert len(failed) == 3
    assert all("API key" in f["error"] and "revoked" in f["error"] for f in failed)
    assert _refused("api_key_revoked") - before == 3
    async with db.read() as conn:
        row = await sched_q.get_schedule(conn, TENANT, sid)
    assert row["last_error"] is not None and "revoked" in row["last_error"]
    assert row["fired_count"] == 1


async def test_a_jwt_schedule_is_unaffected_and_suspension_is_rechecked(
    settings: Settings, db: Database
) -> None:
    submitter = await _setup(db, settings)
    sched = await engine.create_schedule(
        db,
        submitter,
        engine.ScheduleSpec(
            name="j", workflow="sp-tenant", cron="* * * * *", overlap=engine.Overlap.ALLOW_ALL
        ),
        tenant_id=TENANT,
        subject="alice",
        now=T0,
    )
    assert sched["api_key_id"] is None and sched["access"] == "tenant"
    clock = engine.VirtualClock(T0)
    loop = engine.Scheduler(db, settings, clock=clock)
    clock.advance(60)
    assert (await loop.run_once()).started == 1
    await TenantService(db).suspend(tenant_id=TENANT, reason="unpaid", actor="op")
    before = _refused("tenant_suspended")
    clock.advance(60)
    assert (await loop.run_once()).failed == 1
    assert _refused("tenant_suspended") - before == 1
    assert len(await _runs(db)) == 1
    await TenantService(db).resume(tenant_id=TENANT, actor="op")
    clock.advance(60)
    assert (await loop.run_once()).started == 1


def _client(settings: Settings, db: Database) -> httpx.AsyncClient:
    app = create_app(settings, db=db, check_schema_on_start=False)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def _as(subject: str, *, admin: bool = False) -> dict[str, str]:
    scopes: Any = ALL_SCOPES if admin else [s for s in Scope if s != Scope.ADMIN]
    tok = DevTokens(DEV_SECRET).mint(tenant_id=TENANT, subject=subject, scopes=scopes)
    return {"Authorization": f"Bearer {tok}"}


async def test_owner_policy_schedules_belong_to_their_creator(
    settings: Settings, db: Database
) -> None:
    await _setup(db, settings)
    alice, bob, root = _as("alice"), _as("bob"), _as("root", admin=True)
    async with _client(settings, db) as api:
        body = {"name": "mine", "workflow": "sp-owned", "input": {"n": 1}, "cron": "0 0 1 1 *"}
        created = await api.post("/schedules", json=body, headers=alice)
        assert created.status_code == 201, created.text
        assert created.json()["access"] == "owner" and created.json()["blocked_reason"] is None
        sid = created.json()["schedule_id"]
        before = await api.get(f"/schedules/{sid}", headers=alice)
        for method, path, payload in [
            ("GET", f"/schedules/{sid}", None),
            ("GET", f"/schedules/{sid}/fires", None),
            ("PATCH", f"/schedules/{sid}", {"input": {"n": 2}}),
            ("POST", f"/schedules/{sid}/pause", None),
            ("POST", f"/schedules/{sid}/resume", None),
            ("POST", f"/schedules/{sid}/trigger", None),
            ("DELETE", f"/schedules/{sid}", None),
        ]:
            resp = await api.request(method, path, json=payload, headers=bob)
            assert resp.status_code == 404, (method, path, resp.text)
            assert resp.json()["code"] == "schedule_not_found"
        assert sid not in (await api.get("/schedules", headers=bob)).text
        assert sid in (await api.get("/schedules", headers=alice)).text
        assert sid in (await api.get("/schedules", headers=root)).text
        assert (await api.get(f"/schedules/{sid}", headers=alice)).json() == before.json()
        assert await _runs(db) == []

        # The creator's trigger starts an owner-policy run in her name: bob cannot see it.
        fired = await api.post(f"/schedules/{sid}/trigger", headers=alice)
        assert fired.json()["outcome"] == "started", fired.text
        run_id = fired.json()["run_id"]
        assert (await api.get(f"/runs/{run_id}", headers=bob)).status_code == 404
        assert run_id not in (await api.get("/runs", headers=bob)).text
        run = (await api.get(f"/runs/{run_id}", headers=alice)).json()
        assert run["access"] == "owner"

        # A tenant schedule stays shared, but bob cannot make it an owner-policy one in
        # alice's name (nor can alice's own be re-pointed by him); alice can.
        shared = await api.post(
            "/schedules",
            json={"name": "shared", "workflow": "sp-tenant", "cron": "0 0 1 1 *"},
            headers=alice,
        )
        shared_id = shared.json()["schedule_id"]
        ok = await api.patch(f"/schedules/{shared_id}", json={"jitter_seconds": 5}, headers=bob)
        assert ok.status_code == 200, ok.text
        refused = await api.patch(
            f"/schedules/{shared_id}", json={"workflow": "sp-owned"}, headers=bob
        )
        assert refused.status_code == 403, refused.text
        assert refused.headers["content-type"].startswith("application/problem+json")
        kept = (await api.get(f"/schedules/{shared_id}", headers=alice)).json()
        assert kept["workflow"] == "sp-tenant" and kept["access"] == "tenant"
        mine = await api.patch(
            f"/schedules/{shared_id}", json={"workflow": "sp-owned"}, headers=alice
        )
        assert mine.status_code == 200 and mine.json()["access"] == "owner"
        assert (await api.get(f"/schedules/{shared_id}", headers=bob)).status_code == 404


async def test_a_revoked_keys_schedule_shows_why_over_http(
    settings: Settings, db: Database
) -> None:
    await _setup(db, settings)
    root = _as("root", admin=True)
    async with _client(settings, db) as api:
        made = await api.post(
            "/admin/api-keys", json={"name": "k", "scopes": ["runs:write"]}, headers=root
        )
        key = made.json()
        as_key = {"Authorization": f"Bearer {key['api_key']}"}
        created = await api.post(
            "/schedules",
            json={"name": "k", "workflow": "sp-tenant", "cron": "0 0 1 1 *"},
            headers=as_key,
        )
        assert created.status_code == 201, created.text
        sid = created.json()["schedule_id"]
        assert created.json()["created_by"].startswith("api-key:")
        await api.delete(f"/admin/api-keys/{key['key_id']}", headers=root)
        shown = (await api.get(f"/schedules/{sid}", headers=root)).json()
        assert shown["blocked_reason"] is not None and "revoked" in shown["blocked_reason"]
        listed = (await api.get("/schedules", headers=root)).json()["items"]
        assert [s["blocked_reason"] for s in listed] == [shown["blocked_reason"]]
        fired = (await api.post(f"/schedules/{sid}/trigger", headers=root)).json()
        assert fired["outcome"] == "failed" and fired["run_id"] is None
        assert fired["error"] == shown["blocked_reason"]
    assert await _runs(db) == []


async def test_children_of_an_owner_policy_run_are_owner_policy(
    settings: Settings, db: Database
) -> None:
    submitter = await _setup(db, settings)
    parent, _ = await submitter.submit(
        SubmitRequest(workflow="sp-parent", input={}), tenant_id=TENANT, subject="alice"
    )
    async with workers(settings, db, REGISTRY):
        await reach(db, TENANT, parent["run_id"], RunStatus.COMPLETED.value)
        children = [r for r in await _runs(db) if r["parent_run_id"] == parent["run_id"]]
        assert len(children) == 2
        for child in children:
            await reach(db, TENANT, child["run_id"], RunStatus.COMPLETED.value)
    for child in children:
        assert child["access"] == "owner" and child["created_by"] == "alice"
    async with _client(settings, db) as api:
        for child in children:
            path = f"/runs/{child['run_id']}"
            assert (await api.get(path, headers=_as("bob"))).status_code == 404
            assert (await api.get(path, headers=_as("alice"))).status_code == 200
