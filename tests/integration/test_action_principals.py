"""Actions on runs need one scope per verb, single or bulk, under the actor's principal.

Issue 34: ``POST /runs:cancel`` worked with ``runs:write`` alone while ``POST
/runs/{id}/cancel`` needs ``runs:cancel``. ``app.auth.principal.ACTION_SCOPES`` is now the
one table both read; a batch stores its creator's scopes and API key, and the batch
runner re-checks them for every item (docs/adr/0052-bulk-actions-under-their-creators-
principal.md). Both databases; the API in-process over real routes, workers in-process.

The second half walks every path by which one subject's input reaches another subject's
``access="owner"`` run (signals, approvals, bulk actions, rerun, retry, requeue, pause,
schedules; events are in tests/integration/test_event_triggers.py): each is ``404`` (or,
in bulk, skipped ``not_found``) and changes nothing, while an ``admin`` gets through.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from sqlalchemy import func, select, update

from app.auth.dev import DevTokens
from app.auth.principal import ACTION_SCOPES, ALL_SCOPES, RunAction, Scope
from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import batches, events, signals
from app.engine.batches import BatchAction, BatchRunner
from app.engine.registry import Registry
from app.sdk import Permanent, WorkflowContext, workflow
from tests.conftest import DEV_SECRET, make_settings
from tests.integration import support

TENANT = "acts"
USER = frozenset(s for s in Scope if s != Scope.ADMIN)
# Written out, not read from ACTION_SCOPES: the table itself is under test.
BULK_SCOPES = {
    "cancel": "runs:cancel",
    "signal": "signals:write",
    "retry": "runs:write",
    "resume": "runs:write",
    "pause": "runs:write",
    "unpause": "runs:write",
}


class Job(BaseModel):
    key: str = "k"


def decline() -> None:
    raise Permanent(ValueError("declined"))


def one() -> int:
    return 1


@workflow("acts-wait")
async def waits(ctx: WorkflowContext, job: Job) -> Any:
    return await ctx.signal("go")


@workflow("acts-nap")
async def naps(ctx: WorkflowContext, job: Job) -> None:
    await ctx.sleep(3600)


@workflow("acts-fail")
async def fails(ctx: WorkflowContext, job: Job) -> None:
    await ctx.step(decline, name="charge")


@workflow("acts-own-wait", access="owner")
async def own_waits(ctx: WorkflowContext, job: Job) -> Any:
    return await ctx.signal("go")


@workflow("acts-own-approve", access="owner")
async def own_approves(ctx: WorkflowContext, job: Job) -> bool:
    return (await ctx.approval("ok")).approved


@workflow("acts-own-fail", access="owner")
async def own_fails(ctx: WorkflowContext, job: Job) -> None:
    await ctx.step(decline, name="charge")


@workflow("acts-own-done", access="owner")
async def own_done(ctx: WorkflowContext, job: Job) -> int:
    return await ctx.step(one, name="one")


REGISTRY = Registry([waits, naps, fails, own_waits, own_approves, own_fails, own_done])


@pytest.fixture
def asettings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, tmp_path, inline_retry_max_seconds=0.0)


def bearer(subject: str, scopes: frozenset[Scope] | set[Scope]) -> dict[str, str]:
    tok = DevTokens(DEV_SECRET).mint(tenant_id=TENANT, subject=subject, scopes=scopes)
    return {"Authorization": f"Bearer {tok}"}


async def start(client: httpx.AsyncClient, wf: str, headers: dict[str, str] | None = None) -> str:
    resp = await client.post(
        "/runs", json={"workflow": wf, "input": {"key": uuid.uuid4().hex}}, headers=headers
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["run_id"])


async def drain(db: Database, settings: Settings) -> None:
    runner = BatchRunner(db, settings, worker_id="acts-runner")
    while await runner.run_once():
        pass


async def count(db: Database, table: Any, *where: Any) -> int:
    async with db.read() as conn:
        found = await conn.execute(select(func.count()).select_from(table).where(*where))
        return int(found.scalar_one())


def bulk_body(verb: str, run_id: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"run_ids": [run_id], **extra}
    if verb == "signal":
        body["name"] = "go"
    return body


async def test_the_table_names_every_bulk_verb() -> None:
    # Every bulk verb is a single-run verb, and needs exactly its scope.
    assert {a.value: a.scope.value for a in BatchAction} == BULK_SCOPES
    for action in BatchAction:
        assert ACTION_SCOPES[RunAction(action.value)] == action.scope


async def test_each_bulk_verb_needs_its_single_actions_scope(
    asettings: Settings, db: Database
) -> None:
    async with support.api_client(asettings, db, TENANT) as admin:
        async with db.write() as conn:
            await REGISTRY.register(conn)
        target = {
            "cancel": await start(admin, "acts-wait"),
            "signal": await start(admin, "acts-wait"),
            "pause": await start(admin, "acts-wait"),
            "unpause": await start(admin, "acts-wait"),
            "resume": await start(admin, "acts-nap"),
            "retry": await start(admin, "acts-fail"),
        }
        async with support.workers(asettings, db, REGISTRY):
            for verb, status in (("resume", "waiting_timer"), ("retry", "failed")):
                await support.reach(db, TENANT, uuid.UUID(target[verb]), status)
            await support.reach(db, TENANT, uuid.UUID(target["unpause"]), "waiting_signal")
        paused = await admin.post(f"/runs/{target['unpause']}/pause", json={})
        assert paused.status_code == 200, paused.text

        for verb, scope in BULK_SCOPES.items():
            run_id = target[verb]
            before = await admin.get(f"/runs/{run_id}")
            lacking = bearer("u", {s for s in USER if s.value != scope})
            for extra in ({"dry_run": True}, {}):
                resp = await admin.post(
                    f"/runs:{verb}", json=bulk_body(verb, run_id, **extra), headers=lacking
                )
                assert resp.status_code == 403, (verb, resp.text)
                assert resp.json()["required_scope"] == scope, (verb, resp.json())
            assert await count(db, batches) == 0, verb  # nothing stored
            assert (await admin.get(f"/runs/{run_id}")).json() == before.json(), verb

            holding = bearer("u", {Scope(scope), Scope.RUNS_READ})
            resp = await admin.post(f"/runs:{verb}", json=bulk_body(verb, run_id), headers=holding)
            assert resp.status_code == 202, (verb, resp.text)
            await drain(db, asettings)
            got = (await admin.get(f"/batches/{resp.json()['batch_id']}", headers=holding)).json()
            assert (got["done"], got["skipped"], got["failed"]) == (1, 0, 0), (verb, got)
            async with db.write() as conn:
                await conn.execute(batches.delete())  # "nothing stored" stays checkable
        run = {verb: (await admin.get(f"/runs/{rid}")).json() for verb, rid in target.items()}
        assert run["cancel"]["status"] == "cancelled"
        assert run["pause"]["paused_at"] is not None
        assert run["unpause"]["paused_at"] is None
        assert run["retry"]["status"] == "queued"
        assert await count(db, signals, signals.c.run_id == uuid.UUID(target["signal"])) == 1


async def test_batch_items_are_rechecked_under_the_creators_stored_principal(
    asettings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with support.api_client(asettings, db, TENANT) as admin:
        cancels = bearer("u", {Scope.RUNS_CANCEL, Scope.RUNS_READ})

        async def batch_for(run_id: str, headers: dict[str, str]) -> str:
            resp = await admin.post("/runs:cancel", json={"run_ids": [run_id]}, headers=headers)
            assert resp.status_code == 202, resp.text
            return str(resp.json()["batch_id"])

        async def outcome(batch_id: str) -> dict[str, Any]:
            await drain(db, asettings)
            got: dict[str, Any] = (await admin.get(f"/batches/{batch_id}")).json()
            return got

        # A stored principal without the scope (what a batch of older code holds, or any
        # tampering): every item fails forbidden and the run is not touched.
        for stored in ('["runs:read", "runs:write"]', None):
            run_id = await start(admin, "acts-wait")
            batch_id = await batch_for(run_id, cancels)
            async with db.write() as conn:
                await conn.execute(
                    update(batches)
                    .where(batches.c.batch_id == uuid.UUID(batch_id))
                    .values(scopes=stored)
                )
            got = await outcome(batch_id)
            assert (got["done"], got["failed"]) == (0, 1), got
            assert got["failures"][0]["code"] == "forbidden", got
            if stored is not None:
                assert "runs:cancel" in got["failures"][0]["detail"]
            assert (await admin.get(f"/runs/{run_id}")).json()["status"] == "queued"

        # An API key revoked after the batch was created: its items are refused.
        created = await admin.post(
            "/admin/api-keys", json={"name": "bulk", "scopes": ["runs:cancel", "runs:read"]}
        )
        assert created.status_code == 201, created.text
        key = created.json()
        run_id = await start(admin, "acts-wait")
        batch_id = await batch_for(run_id, {"Authorization": f"Bearer {key['api_key']}"})
        revoked = await admin.delete(f"/admin/api-keys/{key['key_id']}")
        assert revoked.status_code in (200, 204), revoked.text
        got = await outcome(batch_id)
        assert (got["done"], got["failed"]) == (0, 1), got
        assert got["failures"][0]["code"] == "api_key_revoked", got
        assert (await admin.get(f"/runs/{run_id}")).json()["status"] == "queued"

        # The tenant suspended meanwhile: a user's items are refused, an admin's are not
        # (as their requests would be).
        run_id, other = await start(admin, "acts-wait"), await start(admin, "acts-wait")
        users = await batch_for(run_id, cancels)
        admins = await batch_for(other, bearer("root", ALL_SCOPES))
        suspend = await admin.post(f"/admin/tenants/{TENANT}/suspend", json={"reason": "test"})
        assert suspend.status_code == 200, suspend.text
        try:
            got = await outcome(users)
            assert (got["done"], got["failed"]) == (0, 1), got
            assert got["failures"][0]["code"] == "tenant_suspended", got
            got = await outcome(admins)
            assert (got["done"], got["failed"]) == (1, 0), got
        finally:
            await admin.post(f"/admin/tenants/{TENANT}/resume")


async def test_no_path_lets_a_colleague_act_on_an_owner_policy_run(
    asettings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    alice_h, bob_h = bearer("alice", USER), bearer("bob", USER)
    async with support.api_client(asettings, db, TENANT) as client:
        run = {
            "wait": await start(client, "acts-own-wait", alice_h),
            "approve": await start(client, "acts-own-approve", alice_h),
            "fail": await start(client, "acts-own-fail", alice_h),
            "done": await start(client, "acts-own-done", alice_h),
            "paused": await start(client, "acts-own-wait", alice_h),
        }
        async with support.workers(asettings, db, REGISTRY):
            for name, status in (
                ("wait", "waiting_signal"),
                ("approve", "waiting_approval"),
                ("fail", "failed"),
                ("done", "completed"),
                ("paused", "waiting_signal"),
            ):
                await support.reach(db, TENANT, uuid.UUID(run[name]), status)
        assert (await client.post(f"/runs/{run['paused']}/pause", headers=alice_h)).is_success
        steps = (await client.get(f"/runs/{run['approve']}/steps", headers=alice_h)).json()
        step_id = next(s["step_id"] for s in steps["items"] if s["status"] == "waiting")
        dead = (await client.get("/dead-letters", headers=alice_h)).json()["items"]
        dl_id = next(d["dead_letter_id"] for d in dead if d["run_id"] == run["fail"])
        schedule = await client.post(
            "/schedules",
            headers=alice_h,
            json={"name": "hers", "workflow": "acts-own-done", "cron": "0 0 1 1 *"},
        )
        assert schedule.status_code == 201, schedule.text
        sid = schedule.json()["schedule_id"]

        async def snapshot() -> list[Any]:
            views = [(await client.get(f"/runs/{r}", headers=alice_h)).json() for r in run.values()]
            return [
                views,
                await count(db, signals),
                await count(db, events),
                (await client.get("/runs", headers=alice_h, params={"limit": 200})).json(),
            ]

        before = await snapshot()
        calls: list[tuple[str, str, Any]] = [
            ("POST", f"/runs/{run['wait']}/signals/go", {"payload": "bob's"}),
            ("POST", f"/runs/{run['approve']}/approvals/{step_id}", {"decision": "approve"}),
            ("POST", f"/runs/{run['fail']}/retry", {"reason": "bob"}),
            ("POST", f"/dead-letters/{dl_id}/requeue", {"reason": "bob"}),
            ("POST", f"/runs/{run['done']}/rerun", {"from_step": "one"}),
            ("POST", f"/runs/{run['wait']}/pause", {}),
            ("POST", f"/runs/{run['paused']}/unpause", None),
            ("POST", f"/runs/{run['wait']}/resume", None),
            ("POST", f"/runs/{run['wait']}/cancel", {}),
            ("POST", f"/schedules/{sid}/trigger", None),
        ]
        wrong = []
        for method, path, body in calls:
            resp = await client.request(method, path, json=body, headers=bob_h)
            if resp.status_code != 404:
                wrong.append(f"{method} {path}: {resp.status_code} {resp.text[:200]}")
        assert not wrong, "\n".join(wrong)
        # In bulk, by ids: each of alice's runs is skipped as not found.
        targets = {
            "cancel": run["wait"],
            "signal": run["wait"],
            "pause": run["wait"],
            "unpause": run["paused"],
            "resume": run["wait"],
            "retry": run["fail"],
        }
        for verb, rid in targets.items():
            resp = await client.post(f"/runs:{verb}", json=bulk_body(verb, rid), headers=bob_h)
            assert resp.status_code == 202, (verb, resp.text)
            await drain(db, asettings)
            got = (await client.get(f"/batches/{resp.json()['batch_id']}", headers=bob_h)).json()
            assert got["skipped_reasons"] == {"not_found": 1}, (verb, got)
        assert await snapshot() == before

        # An admin of the tenant is not bound by the owner policy (docs/security.md).
        root_h = bearer("root", ALL_SCOPES)
        sent = await client.post(f"/runs/{run['wait']}/signals/go", json={}, headers=root_h)
        assert sent.status_code == 202, sent.text
