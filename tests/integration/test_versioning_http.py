"""Versioning over the HTTP API (in-process ASGI, real database and workers).

A run of a version no live worker has registered shows ``blocked_reason``, is counted by
``GET /workflows`` and the ``treadle_runs_blocked`` gauge, and is migrated with
``POST /runs/{id}/migrate``.
"""

from __future__ import annotations

import httpx

from app.api.app import create_app
from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES, Scope
from app.core.settings import Settings
from app.db.database import Database
from app.engine.registry import Registry
from tests.conftest import DEV_SECRET
from tests.integration.support import reach, submit, workers
from tests.integration.test_versioning import OLD, PATCHED_V2, TENANT


def _client(settings: Settings, db: Database, **mint: object) -> httpx.AsyncClient:
    app = create_app(settings, db=db, check_schema_on_start=False)
    claims = {"tenant_id": TENANT, "subject": "op", "scopes": ALL_SCOPES, **mint}
    tok = DevTokens(DEV_SECRET).mint(**claims)  # type: ignore[arg-type]
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://treadle",
        headers={"Authorization": f"Bearer {tok}"},
    )


async def test_blocked_run_over_http_then_migrated(settings: Settings, db: Database) -> None:
    old_registry = Registry([OLD])
    async with workers(settings, db, old_registry):
        run_id = await submit(db, settings, old_registry, TENANT, "expense", amount=9)
        await reach(db, TENANT, run_id, "waiting_approval")
    v2 = Registry([PATCHED_V2])
    async with workers(settings, db, v2) as (worker,), _client(settings, db) as c:
        async with db.write() as conn:
            await v2.register(conn)
        decided = await c.post(
            f"/runs/{run_id}/approvals/manager",
            json={"decision": "approve"},
            headers={
                "Authorization": "Bearer "
                + DevTokens(DEV_SECRET).mint(tenant_id=TENANT, subject="boss", scopes=ALL_SCOPES)
            },
        )
        assert decided.status_code == 200, decided.text
        run = (await c.get(f"/runs/{run_id}")).json()
        assert run["blocked_reason"] == "no live worker has registered expense@1"
        versions = {
            v["version"]: v
            for w in (await c.get("/workflows")).json()["items"]
            if w["name"] == "expense"
            for v in w["versions"]
        }
        assert (versions["1"]["open_runs"], versions["1"]["blocked_runs"]) == (1, 1)
        assert (versions["2"]["open_runs"], versions["2"]["blocked_runs"]) == (0, 0)
        scrape = (await c.get("/metrics")).text
        assert 'treadle_runs_blocked{workflow="expense"} 1.0' in scrape

        # Refusals: not admin (403), unknown version (404), not newer (409), bad body
        # (422), another tenant (404) — and nothing changes.
        no_admin = DevTokens(DEV_SECRET).mint(
            tenant_id=TENANT, subject="u", scopes=frozenset({Scope.RUNS_WRITE})
        )
        forbidden = await c.post(
            f"/runs/{run_id}/migrate",
            json={"version": "2"},
            headers={"Authorization": f"Bearer {no_admin}"},
        )
        assert forbidden.status_code == 403
        assert (await c.post(f"/runs/{run_id}/migrate", json={"version": "9"})).status_code == 404
        assert (await c.post(f"/runs/{run_id}/migrate", json={"version": 1})).status_code == 409
        assert (await c.post(f"/runs/{run_id}/migrate", json={"versio": 2})).status_code == 422
        other = DevTokens(DEV_SECRET).mint(tenant_id="other", subject="x", scopes=ALL_SCOPES)
        elsewhere = await c.post(
            f"/runs/{run_id}/migrate",
            json={"version": 2},
            headers={"Authorization": f"Bearer {other}"},
        )
        assert elsewhere.status_code == 404
        assert (await c.get(f"/runs/{run_id}")).json()["version"] == "1"

        migrated = await c.post(
            f"/runs/{run_id}/migrate", json={"version": 2, "reason": "retire v1"}
        )
        assert migrated.status_code == 200, migrated.text
        assert migrated.json()["version"] == "2"
        assert migrated.json()["blocked_reason"] is None
        worker.wake()
        done = await reach(db, TENANT, run_id, "completed", "failed")
        assert done["status"] == "completed", done["error"]
        events = (await c.get(f"/runs/{run_id}/events")).json()["items"]
        moved = [e for e in events if e["kind"] == "run_migrated"]
        assert len(moved) == 1 and moved[0]["actor"] == "op"
        assert moved[0]["data"] == {"from_version": "1", "to_version": "2", "reason": "retire v1"}
        app_metrics = (await c.get("/metrics")).text
        assert "treadle_runs_blocked" in app_metrics
