"""The API's verified-token cache on both databases: what it must never let through.

The real app runs in-process (httpx ``ASGITransport``) with a 300 s cache TTL, so a
refusal here comes from the cache's own rules (revocation, ``exp``, the token's hash),
never from an entry timing out. Revocation seen by another process: the acceptance test
tests/acceptance/test_auth_cache_processes.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.api.app import create_app
from app.auth.principal import ALL_SCOPES
from app.auth.token_cache import TokenCache, digest
from app.core.settings import Settings
from app.db.database import Database
from tests.conftest import make_settings
from tests.integration.test_auth import REGISTRY, auth, tok


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, tmp_path, auth_cache_ttl_seconds=300)


@pytest.fixture
async def app(settings: Settings, db: Database) -> FastAPI:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    return create_app(settings, db=db, check_schema_on_start=False)


@pytest.fixture
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://treadle") as client:
        yield client


def cache_of(app: FastAPI) -> TokenCache:
    cache: TokenCache = app.state.authenticator.cache
    return cache


ADMIN = auth(tok(scopes=ALL_SCOPES))


async def new_key(api: httpx.AsyncClient) -> dict[str, Any]:
    resp = await api.post(
        "/admin/api-keys", json={"name": "c", "scopes": ["runs:read"]}, headers=ADMIN
    )
    assert resp.status_code == 201, resp.text
    created: dict[str, Any] = resp.json()
    return created


async def test_a_key_revoked_in_this_process_is_refused_at_once(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    created = await new_key(api)
    key = created["api_key"]
    other = (await new_key(api))["api_key"]
    for k in (key, other):
        assert (await api.get("/runs", headers=auth(k))).status_code == 200
    cache = cache_of(app)
    assert {digest(key), digest(other)} <= cache.digests()  # both cached (300 s)
    revoked = await api.delete(f"/admin/api-keys/{created['key_id']}", headers=ADMIN)
    assert revoked.status_code == 200
    assert digest(key) not in cache.digests()
    refused = await api.get("/runs", headers=auth(key))
    assert refused.status_code == 401
    assert refused.json()["detail"] == "invalid bearer token"
    # Another key stays cached and served.
    assert digest(other) in cache.digests()
    assert (await api.get("/runs", headers=auth(other))).status_code == 200


async def test_a_forged_key_with_a_cached_keys_prefix_is_refused(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    key = (await new_key(api))["api_key"]
    assert (await api.get("/runs", headers=auth(key))).status_code == 200
    assert digest(key) in cache_of(app).digests()
    prefix = key[: len("trd_") + 12 + 1]
    forged = [
        prefix + ("A" * 43 if not key.endswith("A" * 43) else "B" * 43),
        key[:-1] + ("A" if key[-1] != "A" else "B"),
    ]
    for bad in forged:
        for _ in range(2):
            assert (await api.get("/runs", headers=auth(bad))).status_code == 401, bad
    assert cache_of(app).digests() == {digest(ADMIN["Authorization"][7:]), digest(key)}


async def test_suspension_is_checked_on_every_request_even_when_cached(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    member = tok(tenant="globex", subject="bob")
    assert (await api.get("/runs", headers=auth(member))).status_code == 200
    assert digest(member) in cache_of(app).digests()
    operator = auth(tok(tenant="ops", subject="root", scopes=ALL_SCOPES))
    resp = await api.post("/admin/tenants/globex/suspend", json={"reason": "r"}, headers=operator)
    assert resp.status_code == 200, resp.text
    refused = await api.get("/runs", headers=auth(member))
    assert refused.status_code == 403
    assert refused.json()["code"] == "tenant_suspended"
    resp = await api.post("/admin/tenants/globex/resume", headers=operator)
    assert resp.status_code == 200, resp.text
    assert (await api.get("/runs", headers=auth(member))).status_code == 200


async def test_scopes_are_the_verified_tokens_own(api: httpx.AsyncClient, app: FastAPI) -> None:
    reader = tok(scopes=["runs:read"])
    assert (await api.get("/runs", headers=auth(reader))).status_code == 200
    denied = await api.post("/runs", json={"workflow": "auth-shared"}, headers=auth(reader))
    assert denied.status_code == 403  # a cached principal keeps its scopes, no more
    assert denied.json()["required_scope"] == "runs:write"


async def test_unknown_key_is_refused_every_time(api: httpx.AsyncClient, app: FastAPI) -> None:
    unknown = f"trd_{uuid.uuid4().hex[:12]}_{'x' * 43}"
    before = cache_of(app).digests()
    for _ in range(3):
        assert (await api.get("/runs", headers=auth(unknown))).status_code == 401
    assert digest(unknown) not in cache_of(app).digests()
    assert cache_of(app).digests() == before
