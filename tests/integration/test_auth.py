"""API keys, the worker's re-check, the owner policy and admin reads: both databases.

The real app runs in-process (httpx ``ASGITransport``) on a real database; workers are
real in-process workers.
"""

from __future__ import annotations

import hashlib
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
from app.auth.principal import ALL_SCOPES, Scope
from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import api_keys, dead_letters
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.conftest import DEV_SECRET
from tests.integration import support

ALICE_SCOPES = [s for s in ALL_SCOPES if s != Scope.ADMIN]


class Order(BaseModel):
    secret: str


def reveal(secret: str) -> str:
    return f"processed {secret}"


@workflow("auth-shared")
async def shared_flow(ctx: WorkflowContext, order: Order) -> str:
    first = await ctx.step(reveal, order.secret)
    await ctx.signal("go")
    return first


@workflow("auth-owned", access="owner")
async def owned_flow(ctx: WorkflowContext, order: Order) -> str:
    await ctx.signal("go")
    return order.secret


REGISTRY = Registry([shared_flow, owned_flow])


def tok(tenant: str = "acme", subject: str = "alice", scopes: Any = ALICE_SCOPES) -> str:
    return DevTokens(DEV_SECRET).mint(tenant_id=tenant, subject=subject, scopes=scopes)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def api(settings: Settings, db: Database) -> AsyncIterator[httpx.AsyncClient]:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    app = create_app(settings, db=db, check_schema_on_start=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://treadle") as client:
        yield client


async def create_key(
    api: httpx.AsyncClient, scopes: list[str], tenant: str | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "ci", "scopes": scopes}
    if tenant:
        body["tenant"] = tenant
    resp = await api.post("/admin/api-keys", json=body, headers=auth(tok(scopes=ALL_SCOPES)))
    assert resp.status_code == 201, resp.text
    created: dict[str, Any] = resp.json()
    return created


async def test_api_key_lifecycle(api: httpx.AsyncClient, db: Database) -> None:
    created = await create_key(api, ["runs:read"])
    key = created["api_key"]
    assert key.startswith(f"trd_{created['prefix']}_")
    async with db.read() as conn:
        stored = (await conn.execute(select(api_keys))).mappings().one()
    # Only the hash is stored, and it is the SHA-256 of the whole key.
    assert key not in str(dict(stored))
    assert stored["secret_hash"] == hashlib.sha256(key.encode()).hexdigest()
    assert stored["last_used_at"] is None

    assert (await api.get("/runs", headers=auth(key))).status_code == 200
    async with db.read() as conn:
        first_use = (await conn.execute(select(api_keys.c.last_used_at))).scalar_one()
    assert first_use is not None
    assert (await api.get("/runs", headers=auth(key))).status_code == 200
    async with db.read() as conn:
        again = (await conn.execute(select(api_keys.c.last_used_at))).scalar_one()
    assert again == first_use  # at most one write a minute

    # Scopes of the key hold: runs:read only.
    denied = await api.post("/runs", json={"workflow": "auth-shared"}, headers=auth(key))
    assert denied.status_code == 403
    assert denied.json()["required_scope"] == "runs:write"

    # Same prefix, wrong secret; a malformed key; both 401 with WWW-Authenticate.
    forged = key[: -len("x")] + ("A" if key[-1] != "A" else "B")
    for bad in (forged, "trd_nothex", key + "x"):
        resp = await api.get("/runs", headers=auth(bad))
        assert resp.status_code == 401, bad
        assert resp.headers["www-authenticate"].startswith("Bearer")

    listed = (await api.get("/admin/api-keys", headers=auth(tok(scopes=ALL_SCOPES)))).json()
    assert [k["key_id"] for k in listed["items"]] == [created["key_id"]]
    assert "api_key" not in listed["items"][0]
    assert "secret_hash" not in listed["items"][0]
    assert listed["items"][0]["last_used_at"] is not None

    # Another tenant's admin cannot see or revoke it: 404, like a missing id.
    other_admin = auth(tok(tenant="globex", scopes=ALL_SCOPES))
    assert (await api.get("/admin/api-keys", headers=other_admin)).json()["items"] == []
    missing = await api.delete(f"/admin/api-keys/{uuid.uuid4()}", headers=other_admin)
    foreign = await api.delete(f"/admin/api-keys/{created['key_id']}", headers=other_admin)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["code"] == missing.json()["code"] == "api_key_not_found"
    # One answer for both (nothing tells them apart), saying where it looked and what to pass.
    hint = "not found in tenant 'globex'; a key of another tenant needs ?tenant=<its tenant>"
    assert foreign.json()["detail"].endswith(hint), foreign.json()
    assert missing.json()["detail"].endswith(hint), missing.json()
    malformed = await api.delete("/admin/api-keys/not-a-uuid", headers=other_admin)
    assert malformed.status_code == 404 and malformed.json()["detail"].endswith(hint)
    # Naming the tenant looks there (the admin scope reaches every tenant, logged); the
    # wrong tenant named is the same 404, naming it, without the hint.
    elsewhere = await api.delete(
        f"/admin/api-keys/{uuid.uuid4()}?tenant=initech", headers=other_admin
    )
    assert elsewhere.status_code == 404
    assert elsewhere.json()["detail"].endswith("not found in tenant 'initech'"), elsewhere.json()
    # Without admin: 403.
    assert (await api.get("/admin/api-keys", headers=auth(tok()))).status_code == 403

    revoked = await api.delete(
        f"/admin/api-keys/{created['key_id']}", headers=auth(tok(scopes=ALL_SCOPES))
    )
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    assert revoked.json()["revoked_by"] == "alice"
    resp = await api.get("/runs", headers=auth(key))
    assert resp.status_code == 401
    assert resp.headers["content-type"] == "application/problem+json"


async def test_revoked_key_fails_the_run_and_redacts_it(
    api: httpx.AsyncClient, db: Database, settings: Settings
) -> None:
    key = (await create_key(api, ["runs:write", "runs:read", "signals:write"]))["api_key"]
    submitted = await api.post(
        "/runs", json={"workflow": "auth-shared", "input": {"secret": "s3cr3t"}}, headers=auth(key)
    )
    assert submitted.status_code == 201, submitted.text
    run_id = uuid.UUID(submitted.json()["run_id"])
    assert submitted.json()["created_by"].startswith("api-key:")
    async with support.workers(settings, db, REGISTRY):
        await support.reach(db, "acme", run_id, "waiting_signal")
        # Before revocation the payloads are visible.
        steps = (await api.get(f"/runs/{run_id}/steps", headers=auth(key))).json()
        assert steps["items"][0]["output"] == "processed s3cr3t"
        key_id = (await api.get("/admin/api-keys", headers=auth(tok(scopes=ALL_SCOPES)))).json()[
            "items"
        ][0]["key_id"]
        await api.delete(f"/admin/api-keys/{key_id}", headers=auth(tok(scopes=ALL_SCOPES)))
        # The signal (sent by a person of the tenant) wakes the run; its next attempt
        # re-checks the key and ends it.
        sent = await api.post(
            f"/runs/{run_id}/signals/go", json={"payload": 1}, headers=auth(tok())
        )
        assert sent.status_code == 202
        row = await support.reach(db, "acme", run_id, "failed")
    assert row["reason"] == "failure_authorization"
    async with db.read() as conn:
        dls = (
            (await conn.execute(select(dead_letters).where(dead_letters.c.run_id == run_id)))
            .mappings()
            .all()
        )
    assert [d["reason"] for d in dls] == ["failure_authorization"]

    reader = auth(tok())
    run = (await api.get(f"/runs/{run_id}", headers=reader)).json()
    assert run["redacted"] is True
    assert run["input"] is None and run["output"] is None
    assert run["error"]["type"] == "Unauthorized"
    steps = (await api.get(f"/runs/{run_id}/steps", headers=reader)).json()["items"]
    assert steps and all(s["output"] is None and s["detail"] is None for s in steps)
    report = await api.get(f"/runs/{run_id}/report", headers=reader)
    text = await api.get(f"/runs/{run_id}/report?format=text", headers=reader)
    result = await api.get(f"/runs/{run_id}/result", headers=reader)
    for body in (report.text, text.text, result.text, str(run)):
        assert "s3cr3t" not in body
    assert "failure_authorization" in text.text


async def test_owner_policy(api: httpx.AsyncClient, db: Database, settings: Settings) -> None:
    alice, bob = auth(tok(subject="alice")), auth(tok(subject="bob"))
    admin = auth(tok(tenant="ops", subject="root", scopes=ALL_SCOPES))
    owned = await api.post(
        "/runs",
        json={"workflow": "auth-owned", "input": {"secret": "a"}, "idempotency_key": "k1"},
        headers=alice,
    )
    assert owned.status_code == 201
    assert owned.json()["access"] == "owner"
    shared = await api.post(
        "/runs", json={"workflow": "auth-shared", "input": {"secret": "b"}}, headers=alice
    )
    owned_id, shared_id = owned.json()["run_id"], shared.json()["run_id"]
    missing = str(uuid.uuid4())

    def same_404(a: httpx.Response, b: httpx.Response) -> None:
        assert a.status_code == b.status_code == 404
        body_a, body_b = a.json(), b.json()
        for body in (body_a, body_b):
            body.pop("instance"), body.pop("run_id", None)
            body["detail"] = body["detail"].replace(owned_id, "X").replace(missing, "X")
        assert body_a == body_b

    for method, suffix, body in [
        ("GET", "", None),
        ("GET", "/steps", None),
        ("GET", "/events", None),
        ("GET", "/report", None),
        ("GET", "/result", None),
        ("POST", "/cancel", {}),
        ("POST", "/signals/go", {}),
        ("POST", "/approvals/x", {"decision": "approve"}),
        ("POST", "/resume", None),
        ("POST", "/retry", {"reason": "r"}),
    ]:
        got = await api.request(method, f"/runs/{owned_id}{suffix}", json=body, headers=bob)
        none = await api.request(method, f"/runs/{missing}{suffix}", json=body, headers=bob)
        same_404(got, none)
        # The tenant-wide run stays reachable to bob.
        if method == "GET":
            resp = await api.get(f"/runs/{shared_id}{suffix}", headers=bob)
            assert resp.status_code in (200, 202), (suffix, resp.text)
    listed = (await api.get("/runs", headers=bob)).json()["items"]
    assert [r["run_id"] for r in listed] == [shared_id]
    # Bob replaying alice's idempotency key learns nothing about her run.
    replay = await api.post(
        "/runs",
        json={"workflow": "auth-owned", "input": {"secret": "a"}, "idempotency_key": "k1"},
        headers=bob,
    )
    assert replay.status_code == 409
    assert owned_id not in replay.text
    # Alice sees and acts on her run; admins (of any tenant) read it, logged.
    assert (await api.get(f"/runs/{owned_id}", headers=alice)).status_code == 200
    assert len((await api.get("/runs", headers=alice)).json()["items"]) == 2
    # Cross-tenant reads are explicit: without ?tenant= an admin token is tenant-scoped.
    same_404(
        await api.get(f"/runs/{owned_id}", headers=admin),
        await api.get(f"/runs/{missing}", headers=admin),
    )
    with structlog.testing.capture_logs() as logs:
        got = await api.get(f"/runs/{owned_id}", params={"tenant": "acme"}, headers=admin)
        assert got.status_code == 200
        listed_admin = (await api.get("/runs", params={"tenant": "acme"}, headers=admin)).json()
    assert {r["run_id"] for r in listed_admin["items"]} == {owned_id, shared_id}
    reads = [e for e in logs if e["event"] == "admin cross-tenant read"]
    assert len(reads) == 2
    assert all(e["subject"] == "root" and e["tenant"] == "acme" for e in reads)
    # Naming another tenant without admin is 403; the admin's own list is empty.
    other = await api.get("/runs", params={"tenant": "acme"}, headers=auth(tok(tenant="ops")))
    assert other.status_code == 403 and other.json()["required_scope"] == "admin"
    assert (await api.get("/runs", headers=admin)).json()["items"] == []
    cancelled = await api.post(f"/runs/{owned_id}/cancel", json={}, headers=alice)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    async with db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(dead_letters))).scalar()
    assert count == 0


async def test_workflow_access_is_registered(api: httpx.AsyncClient) -> None:
    items = (await api.get("/workflows", headers=auth(tok()))).json()["items"]
    access = {w["name"]: w["versions"][0]["access"] for w in items}
    assert access == {"auth-owned": "owner", "auth-shared": "tenant"}


async def test_bad_key_requests_store_nothing(api: httpx.AsyncClient, db: Database) -> None:
    admin = auth(tok(scopes=ALL_SCOPES))
    for body in (
        {"name": "x", "scopes": ["nope"]},
        {"name": "x", "scopes": []},
        {"name": "", "scopes": ["runs:read"]},
        {"name": "x", "scopes": ["runs:read"], "tenant": "bad tenant"},
    ):
        resp = await api.post("/admin/api-keys", json=body, headers=admin)
        assert resp.status_code == 422, body
    async with db.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(api_keys))).scalar() == 0
