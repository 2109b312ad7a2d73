"""Tenant suspension on both databases.

Queries, the cached gate, the claim's re-check, the HTTP effects (403 tenant_suspended,
the admin exception), the worker failing a suspended tenant's runs, resume and requeue,
and bad input to the admin endpoints.

The real app runs in-process (httpx ``ASGITransport``) on a real database; workers are
real in-process workers.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import structlog
from pydantic import BaseModel
from sqlalchemy import func, select

from app.api.app import create_app
from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES, Principal, Scope
from app.core.errors import InvalidInput, TenantSuspended
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.db.queries import tenants as tenants_q
from app.db.tables import api_keys, dead_letters, events, metadata, tenants
from app.engine.api_keys import ApiKeyService
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.engine.tenants import TenantService, attempt_refusal
from app.sdk import WorkflowContext, workflow
from tests.conftest import DEV_SECRET, make_settings
from tests.helpers import wait_for
from tests.integration import support

USER_SCOPES = [s for s in ALL_SCOPES if s != Scope.ADMIN]


class Secret(BaseModel):
    secret: str


def reveal(secret: str) -> str:
    return f"processed {secret}"


@workflow("tn-echo")
async def echo_flow(ctx: WorkflowContext, inp: Secret) -> str:
    return await ctx.step(reveal, inp.secret)


@workflow("tn-wait")
async def wait_flow(ctx: WorkflowContext, inp: Secret) -> str:
    first = await ctx.step(reveal, inp.secret)
    await ctx.signal("go")
    return first


REGISTRY = Registry([echo_flow, wait_flow])


def tok(tenant: str = "acme", subject: str = "alice", scopes: Any = USER_SCOPES) -> str:
    return DevTokens(DEV_SECRET).mint(tenant_id=tenant, subject=subject, scopes=scopes)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


OPS = auth(tok(tenant="ops", subject="root", scopes=ALL_SCOPES))


@pytest.fixture
def settings(database_url: str, tmp_path: Any) -> Settings:
    # Every request reads the suspended set, so each assertion sees the latest change;
    # the cache window itself is tested on the service below.
    return make_settings(database_url, tmp_path, tenant_cache_seconds=0)


@pytest.fixture
async def api(settings: Settings, db: Database) -> AsyncIterator[httpx.AsyncClient]:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    app = create_app(settings, db=db, check_schema_on_start=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://treadle") as client:
        yield client


async def counts(db: Database) -> dict[str, int]:
    """Row counts of every table: what a refused request must leave as it was."""
    async with db.read() as conn:
        return {
            t.name: (await conn.execute(select(func.count()).select_from(t))).scalar_one()
            for t in metadata.sorted_tables
        }


# --- queries and the service ------------------------------------------------------------


async def test_suspend_and_resume_are_idempotent(db: Database) -> None:
    service = TenantService(db)
    never = await service.get("acme")
    assert (never.status, never.reason, never.changed_by, never.created_at) == (
        "active",
        None,
        None,
        None,
    )
    # Resuming a tenant nobody acted on writes nothing: it is active already.
    assert (await service.resume(tenant_id="acme", actor="ops")).changed_at is None
    assert await service.list_tenants() == []

    first = await service.suspend(tenant_id="acme", reason="unpaid", actor="ops")
    assert (first.status, first.reason, first.changed_by) == ("suspended", "unpaid", "ops")
    assert first.changed_at is not None and first.created_at is not None
    again = await service.suspend(tenant_id="acme", reason="other reason", actor="eve")
    assert again == first  # suspending twice changes nothing, the first reason stays

    resumed = await service.resume(tenant_id="acme", actor="carol")
    assert (resumed.status, resumed.reason, resumed.changed_by) == ("active", None, "carol")
    assert resumed.created_at == first.created_at
    assert resumed.changed_at is not None and resumed.changed_at >= first.changed_at
    assert await service.resume(tenant_id="acme", actor="dave") == resumed

    # Suspended again: a fresh reason and subject on the same row.
    later = await service.suspend(tenant_id="acme", reason="abuse", actor="eve")
    assert (later.status, later.reason, later.changed_by) == ("suspended", "abuse", "eve")
    async with db.read() as conn:
        assert await tenants_q.suspended_ids(conn) == {"acme"}
        assert (await conn.execute(select(func.count()).select_from(tenants))).scalar() == 1


async def test_list_is_keyset_paged_by_id(db: Database) -> None:
    service = TenantService(db)
    for name in ("t3", "t1", "t2", "t4"):
        await service.suspend(tenant_id=name, reason="r", actor="ops")
    await service.resume(tenant_id="t2", actor="ops")
    page = await service.list_tenants(limit=2)
    assert [s.tenant_id for s in page] == ["t1", "t2"]
    rest = await service.list_tenants(after="t2", limit=10)
    assert [s.tenant_id for s in rest] == ["t3", "t4"]
    suspended = await service.list_tenants(status="suspended")
    assert [s.tenant_id for s in suspended] == ["t1", "t3", "t4"]


@pytest.mark.parametrize(
    ("tenant_id", "reason"),
    [
        ("bad tenant", "r"),
        ("", "r"),
        ("x" * 129, "r"),
        ("a\x00b", "r"),
        ("acme\n", "r"),
        ("acme", ""),
        ("acme", "   "),
        ("acme", "x" * 1001),
        ("acme", "nul\x00byte"),
        ("acme", "line\nbreak"),
    ],
)
async def test_service_refuses_bad_input(db: Database, tenant_id: str, reason: str) -> None:
    service = TenantService(db)
    with pytest.raises(InvalidInput):
        await service.suspend(tenant_id=tenant_id, reason=reason, actor="ops")
    assert (await counts(db))["tenants"] == 0


async def test_gate_caches_for_its_window(db: Database) -> None:
    cached = TenantService(db, cache_seconds=3600)
    other_process = TenantService(db)
    alice = Principal(tenant_id="acme", subject="alice", scopes=frozenset({Scope.RUNS_READ}))
    await cached.ensure_active(alice)  # loads the (empty) set into the cache

    await other_process.suspend(tenant_id="acme", reason="unpaid", actor="ops")
    # Another process's change is not seen within the window (that is the window) ...
    await cached.ensure_active(alice)
    # ... but a change through this process clears its cache at once.
    await cached.suspend(tenant_id="globex", reason="unpaid", actor="ops")
    with pytest.raises(TenantSuspended) as refused:
        await cached.ensure_active(alice)
    assert refused.value.code == "tenant_suspended"
    assert refused.value.data == {"tenant": "acme"}
    assert "unpaid" not in refused.value.detail

    # The admin exception: operators of a suspended tenant still get in.
    root = Principal(tenant_id="acme", subject="root", scopes=frozenset({Scope.ADMIN}))
    await cached.ensure_active(root)

    # A short window: the other process's resume is seen once it has passed.
    short = TenantService(db, cache_seconds=0.2)
    with pytest.raises(TenantSuspended):
        await short.ensure_active(alice)
    await other_process.resume(tenant_id="acme", actor="ops")

    async def admitted() -> bool:
        try:
            await short.ensure_active(alice)
        except TenantSuspended:
            return False
        return True

    await wait_for(admitted, timeout=10, what="the resume seen after the cache window")


async def test_claim_carries_both_rechecks(db: Database, settings: Settings) -> None:
    """The claim statement itself says whether each attempt may run (no extra query)."""
    async with db.write() as conn:
        await REGISTRY.register(conn)
    keys = ApiKeyService(db)
    live = await keys.create(tenant_id="acme", name="live", scopes=["runs:write"], created_by="o")
    dead = await keys.create(tenant_id="acme", name="dead", scopes=["runs:write"], created_by="o")
    await keys.revoke(tenant_id="acme", key_id=dead.row["key_id"], actor="o")
    submitter = Submitter(db, settings)

    async def submit(tenant: str, key: uuid.UUID | None) -> uuid.UUID:
        row, _ = await submitter.submit(
            SubmitRequest(workflow="tn-echo", input={"secret": "s"}),
            tenant_id=tenant,
            subject="s",
            api_key_id=key,
        )
        return uuid.UUID(str(row["run_id"]))

    expected = {
        await submit("acme", None): (False, False),
        await submit("acme", live.row["key_id"]): (False, False),
        await submit("acme", dead.row["key_id"]): (False, True),
        await submit("initech", None): (True, False),
        await submit("initech", dead.row["key_id"]): (True, True),
    }
    await TenantService(db).suspend(tenant_id="initech", reason="r", actor="o")
    async with db.write() as conn:
        claimed = await runs_q.claim_runs(
            conn,
            worker_id="w",
            definition_keys=REGISTRY.keys,
            limit=10,
            lease_ttl=30,
        )
    got = {r["run_id"]: (bool(r["tenant_suspended"]), bool(r["api_key_revoked"])) for r in claimed}
    assert got == expected
    assert all(r["due_at"] is not None for r in claimed)
    causes = {
        r["run_id"]: (refusal.error or {}).get("cause") if (refusal := attempt_refusal(r)) else None
        for r in claimed
    }
    # A suspended tenant is named first when both apply.
    assert sorted(causes.values(), key=str) == sorted(
        ["api_key_revoked", None, None, "tenant_suspended", "tenant_suspended"], key=str
    )


# --- HTTP and workers -------------------------------------------------------------------


async def test_suspended_tenant_is_refused_and_its_runs_fail(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    alice = auth(tok(tenant="initech"))
    waiting = await api.post(
        "/runs", json={"workflow": "tn-wait", "input": {"secret": "w4it"}}, headers=alice
    )
    assert waiting.status_code == 201, waiting.text
    waiting_id = uuid.UUID(waiting.json()["run_id"])
    async with support.workers(settings, db, REGISTRY):
        await support.reach(db, "initech", waiting_id, "waiting_signal")
    queued = await api.post(
        "/runs", json={"workflow": "tn-echo", "input": {"secret": "qu3ued"}}, headers=alice
    )
    queued_id = uuid.UUID(queued.json()["run_id"])
    # Another tenant is not affected, before or after.
    bob = auth(tok(tenant="globex", subject="bob"))
    bystander = await api.post(
        "/runs", json={"workflow": "tn-echo", "input": {"secret": "b"}}, headers=bob
    )
    bystander_id = uuid.UUID(bystander.json()["run_id"])

    suspended = await api.post(
        "/admin/tenants/initech/suspend", json={"reason": "invoice unpaid"}, headers=OPS
    )
    assert suspended.status_code == 200, suspended.text
    body = suspended.json()
    assert body["tenant"] == "initech" and body["status"] == "suspended"
    assert body["reason"] == "invoice unpaid" and body["changed_by"] == "root"
    again = await api.post("/admin/tenants/initech/suspend", json={"reason": "x"}, headers=OPS)
    assert again.status_code == 200 and again.json() == body

    # Every request of the tenant's principals: 403 tenant_suspended, nothing changed.
    before = await counts(db)
    for method, path, payload in [
        ("GET", "/runs", None),
        ("GET", f"/runs/{queued_id}", None),
        ("POST", "/runs", {"workflow": "tn-echo", "input": {"secret": "n"}}),
        ("POST", f"/runs/{waiting_id}/signals/go", {"payload": 1}),
        ("POST", f"/runs/{queued_id}/cancel", {"reason": "r"}),
        ("GET", "/dead-letters", None),
        ("GET", "/admin/tenants", None),
    ]:
        resp = await api.request(method, path, headers=alice, json=payload)
        assert resp.status_code == 403, (path, resp.text)
        assert resp.headers["content-type"] == "application/problem+json"
        problem = resp.json()
        assert problem["code"] == "tenant_suspended" and problem["tenant"] == "initech"
        assert problem["type"] == "urn:treadle:problem:tenant_suspended"
        assert "invoice" not in resp.text  # the reason is for operators only
    assert await counts(db) == before
    # Not the other tenant.
    assert (await api.get("/runs", headers=bob)).status_code == 200

    # The tenant's own admin is exempt: it can still read, and signal the waiting run.
    root = auth(tok(tenant="initech", subject="root", scopes=ALL_SCOPES))
    assert (await api.get(f"/runs/{waiting_id}", headers=root)).status_code == 200
    sent = await api.post(f"/runs/{waiting_id}/signals/go", json={"payload": 1}, headers=root)
    assert sent.status_code == 202, sent.text

    async with support.workers(settings, db, REGISTRY):
        queued_row = await support.reach(db, "initech", queued_id, "failed")
        # The waiting run is caught at its next attempt (the signal woke it).
        waiting_row = await support.reach(db, "initech", waiting_id, "failed")
        await support.reach(db, "globex", bystander_id, "completed")
    for row in (queued_row, waiting_row):
        assert row["reason"] == "failure_authorization"
    async with db.read() as conn:
        letters = (
            (await conn.execute(select(dead_letters).order_by(dead_letters.c.run_id)))
            .mappings()
            .all()
        )
        failed_events = (
            (await conn.execute(select(events).where(events.c.kind == "run_failed")))
            .mappings()
            .all()
        )
    assert sorted(d["run_id"] for d in letters) == sorted([queued_id, waiting_id])
    assert {d["reason"] for d in letters} == {"failure_authorization"}
    # The timeline says why: the tenant was suspended (not a revoked key).
    assert len(failed_events) == 2
    assert all('"cause":"tenant_suspended"' in e["data"] for e in failed_events)

    # Redacted in every read (read by the tenant's admin, or another tenant's operator).
    for run_id in (queued_id, waiting_id):
        run = (await api.get(f"/runs/{run_id}", headers=root)).json()
        assert run["redacted"] is True and run["input"] is None and run["output"] is None
        assert run["error"]["cause"] == "tenant_suspended"
        assert "initech" in run["error"]["message"] and "invoice" not in str(run)
        steps = (await api.get(f"/runs/{run_id}/steps", headers=root)).json()["items"]
        assert all(s["output"] is None for s in steps)
        evs = (await api.get(f"/runs/{run_id}/events", headers=root)).json()["items"]
        failed = [e for e in evs if e["kind"] == "run_failed"]
        assert failed[0]["data"]["cause"] == "tenant_suspended"
        report = await api.get(f"/runs/{run_id}/report?format=text", headers=root)
        cross = await api.get(f"/runs/{run_id}/report?tenant=initech", headers=OPS)
        for text in (report.text, cross.text, str(steps), str(evs)):
            assert "qu3ued" not in text and "w4it" not in text
        assert "failure_authorization" in report.text

    # Requeued while still suspended: it fails again.
    queued_letter = next(d for d in letters if d["run_id"] == queued_id)
    requeued = await api.post(
        f"/dead-letters/{queued_letter['dead_letter_id']}/requeue",
        json={"reason": "try"},
        headers=root,
    )
    assert requeued.status_code == 200, requeued.text
    async with support.workers(settings, db, REGISTRY):
        await wait_for(
            lambda: _dead_letters(db, queued_id, 2), timeout=30, what="a second dead letter"
        )

    # Resume: new work gets in, and requeued dead letters run to completion.
    resumed = await api.post("/admin/tenants/initech/resume", headers=OPS)
    assert resumed.status_code == 200 and resumed.json()["status"] == "active"
    assert resumed.json()["reason"] is None
    assert (await api.get("/runs", headers=alice)).status_code == 200
    fresh = await api.post(
        "/runs", json={"workflow": "tn-echo", "input": {"secret": "fr3sh"}}, headers=alice
    )
    fresh_id = uuid.UUID(fresh.json()["run_id"])
    async with db.read() as conn:
        pending = (
            await conn.execute(
                select(dead_letters.c.dead_letter_id).where(
                    dead_letters.c.run_id == queued_id, dead_letters.c.status == "pending"
                )
            )
        ).scalar_one()
    requeued = await api.post(
        f"/dead-letters/{pending}/requeue", json={"reason": "tenant resumed"}, headers=alice
    )
    assert requeued.status_code == 200, requeued.text
    async with support.workers(settings, db, REGISTRY):
        await support.reach(db, "initech", fresh_id, "completed")
        await support.reach(db, "initech", queued_id, "completed")
    run = (await api.get(f"/runs/{queued_id}", headers=alice)).json()
    assert run["redacted"] is False and run["output"] == "processed qu3ued"

    listed = (await api.get("/admin/tenants", headers=OPS)).json()
    assert [(t["tenant"], t["status"]) for t in listed["items"]] == [("initech", "active")]
    assert listed["next_page_token"] is None


async def _dead_letters(db: Database, run_id: uuid.UUID, n: int) -> bool:
    async with db.read() as conn:
        count = await conn.execute(
            select(func.count()).select_from(dead_letters).where(dead_letters.c.run_id == run_id)
        )
        return count.scalar_one() >= n


async def test_api_key_of_a_suspended_tenant(api: httpx.AsyncClient, db: Database) -> None:
    created = await api.post(
        "/admin/api-keys",
        json={"name": "ci", "scopes": ["runs:read"], "tenant": "initech"},
        headers=OPS,
    )
    key = created.json()["api_key"]
    await api.post("/admin/tenants/initech/suspend", json={"reason": "r"}, headers=OPS)
    resp = await api.get("/runs", headers=auth(key))
    assert resp.status_code == 403 and resp.json()["code"] == "tenant_suspended"
    async with db.read() as conn:
        # Refused before anything is written, even the key's last use.
        assert (await conn.execute(select(api_keys.c.last_used_at))).scalar_one() is None
    await api.post("/admin/tenants/initech/resume", headers=OPS)
    assert (await api.get("/runs", headers=auth(key))).status_code == 200


async def test_list_pages(api: httpx.AsyncClient) -> None:
    for name in ("t1", "t2", "t3"):
        resp = await api.post(f"/admin/tenants/{name}/suspend", json={"reason": "r"}, headers=OPS)
        assert resp.status_code == 200
    await api.post("/admin/tenants/t2/resume", headers=OPS)
    first = (await api.get("/admin/tenants?limit=2", headers=OPS)).json()
    assert [t["tenant"] for t in first["items"]] == ["t1", "t2"]
    second = (
        await api.get(f"/admin/tenants?limit=2&page_token={first['next_page_token']}", headers=OPS)
    ).json()
    assert [t["tenant"] for t in second["items"]] == ["t3"] and second["next_page_token"] is None
    only = (await api.get("/admin/tenants?status=suspended", headers=OPS)).json()
    assert [t["tenant"] for t in only["items"]] == ["t1", "t3"]
    # A token of another listing (other filters) or altered: 400.
    wrong = await api.get(
        f"/admin/tenants?status=suspended&page_token={first['next_page_token']}", headers=OPS
    )
    assert wrong.status_code == 400
    altered = await api.get("/admin/tenants?page_token=AAAA", headers=OPS)
    assert altered.status_code == 400


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/admin/tenants/bad%20tenant/suspend", {"reason": "r"}, 422),
        ("/admin/tenants/a%00b/suspend", {"reason": "r"}, 422),
        ("/admin/tenants/" + "x" * 129 + "/suspend", {"reason": "r"}, 422),
        ("/admin/tenants/%C3%A9/suspend", {"reason": "r"}, 422),
        ("/admin/tenants/bad%20tenant/resume", None, 422),
        ("/admin/tenants/acme/suspend", None, 422),
        ("/admin/tenants/acme/suspend", {}, 422),
        ("/admin/tenants/acme/suspend", {"reason": ""}, 422),
        ("/admin/tenants/acme/suspend", {"reason": "x" * 1001}, 422),
        ("/admin/tenants/acme/suspend", {"reason": "nul\x00byte"}, 422),
        ("/admin/tenants/acme/suspend", {"reason": 7}, 422),
        ("/admin/tenants/acme/suspend", {"reason": "r", "extra": 1}, 422),
        ("/admin/tenants/acme/suspend", "not json", 400),
    ],
)
async def test_bad_input_is_refused_and_stores_nothing(
    api: httpx.AsyncClient, db: Database, path: str, body: Any, status: int
) -> None:
    before = await counts(db)
    if isinstance(body, str):
        resp = await api.post(
            path, content=body, headers={**OPS, "Content-Type": "application/json"}
        )
    else:
        resp = await api.post(path, headers=OPS, json=body)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert await counts(db) == before


async def test_admin_endpoints_need_admin(api: httpx.AsyncClient, db: Database) -> None:
    alice = auth(tok())
    for method, path, body in [
        ("GET", "/admin/tenants", None),
        ("POST", "/admin/tenants/acme/suspend", {"reason": "r"}),
        ("POST", "/admin/tenants/acme/resume", None),
    ]:
        resp = await api.request(method, path, headers=alice, json=body)
        assert resp.status_code == 403
        assert resp.json()["required_scope"] == "admin"
    assert (await counts(db))["tenants"] == 0
    unauth = await api.post("/admin/tenants/acme/suspend", json={"reason": "r"})
    assert unauth.status_code == 401


async def test_suspend_and_resume_are_audited(api: httpx.AsyncClient) -> None:
    with structlog.testing.capture_logs() as logs:
        await api.post("/admin/tenants/initech/suspend", json={"reason": "r"}, headers=OPS)
        await api.post("/admin/tenants/initech/resume", headers=OPS)
        await api.get("/admin/tenants", headers=OPS)
    audit = [(e["event"], e.get("tenant"), e["subject"]) for e in logs if "subject" in e]
    assert audit == [
        ("admin tenant suspended", "initech", "root"),
        ("admin tenant resumed", "initech", "root"),
        ("admin tenant list", None, "root"),
    ]


async def test_a_suspended_tenants_schedules_start_no_runs(
    api: httpx.AsyncClient, db: Database
) -> None:
    alice = auth(tok(tenant="initech"))
    created = await api.post(
        "/schedules",
        json={
            "name": "nightly",
            "workflow": "tn-echo",
            "input": {"secret": "s"},
            "cron": "0 2 * * *",
        },
        headers=alice,
    )
    assert created.status_code == 201, created.text
    schedule_id = created.json()["schedule_id"]
    await api.post("/admin/tenants/initech/suspend", json={"reason": "r"}, headers=OPS)
    # The tenant's admin may still trigger it: the tick is used up as a failed fire that
    # says why, and no run is started in the suspended tenant's name.
    root = auth(tok(tenant="initech", subject="root", scopes=ALL_SCOPES))
    fired = await api.post(f"/schedules/{schedule_id}/trigger", headers=root)
    assert fired.status_code == 200, fired.text
    assert fired.json()["outcome"] == "failed" and fired.json()["run_id"] is None
    assert fired.json()["error"] == "tenant 'initech' is suspended"
    assert (await counts(db))["runs"] == 0
    schedule = (await api.get(f"/schedules/{schedule_id}", headers=root)).json()
    assert schedule["last_error"] == "tenant 'initech' is suspended"
    assert schedule["fired_count"] == 0
    # Resumed: the next trigger starts a run.
    await api.post("/admin/tenants/initech/resume", headers=OPS)
    fired = await api.post(f"/schedules/{schedule_id}/trigger", headers=alice)
    assert fired.json()["outcome"] == "started" and fired.json()["run_id"] is not None
