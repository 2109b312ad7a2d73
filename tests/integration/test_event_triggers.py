"""POST /events: triggers, filters, idempotency, ctx.wait_for_event (both databases).

docs/adr/0029-event-triggers.md. The API runs in-process (real routes, real database);
workers are in-process too, released between waits (inline_retry_max_seconds=0).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select, type_coerce

from app.auth.dev import DevTokens
from app.auth.principal import Scope
from app.client import AsyncTreadleClient, TreadleAPIError
from app.core.settings import Settings
from app.db.database import Database
from app.db.dialect import now_expr
from app.db.types import UtcDateTime
from app.engine.registry import Registry
from app.sdk import WaitTimedOut, WorkflowContext, workflow
from tests.conftest import DEV_SECRET, make_settings
from tests.helpers import wait_for
from tests.integration import support

TENANT = "evt"


class Order(BaseModel):
    order_id: str
    currency: str = "EUR"


class Strict(BaseModel):
    amount: int


class Waiter(BaseModel):
    order_id: str
    # Far beyond the per-test timeout (120 s): a wait that is not about its timeout never
    # times out inside a test. With 30 s it did once, under load: one POST /events took
    # 31.9 s, both waits timed out and the next post was delivered nowhere.
    timeout: float = 3600.0
    # Wait for signal "go" after the event: the run is released for certain (a short
    # timer may fire inline when its record write outlasts it), so the last execution
    # replays the event wait from the journal.
    then_signal: bool = False


@workflow("ev-eur", on_event="order.paid", event_filter={"currency": "EUR"})
async def eur_only(ctx: WorkflowContext, order: Order) -> str:
    return f"eur:{order.order_id}"


@workflow("ev-any", on_event="order.paid")
async def any_paid(ctx: WorkflowContext, order: Order) -> str:
    return f"any:{order.order_id}"


@workflow("ev-shipped", on_event="order.shipped")
async def shipped(ctx: WorkflowContext, order: Order) -> str:
    return "shipped"


# Version 1 declared the trigger, version 2 (the latest) does not: no event starts it.
@workflow("ev-retired", version=1, on_event="order.paid")
async def retired_v1(ctx: WorkflowContext, order: Order) -> str:
    return "v1"


@workflow("ev-retired", version=2)
async def retired_v2(ctx: WorkflowContext, order: Order) -> str:
    return "v2"


@workflow("ev-strict", on_event="invoice.sent")
async def strict(ctx: WorkflowContext, inp: Strict) -> int:
    return inp.amount


@workflow("ev-waiter")
async def waiter(ctx: WorkflowContext, inp: Waiter) -> dict[str, Any]:
    try:
        got = await ctx.wait_for_event(
            "payment.done", match={"order.id": inp.order_id}, timeout=inp.timeout
        )
    except WaitTimedOut:
        return {"timed_out": True}
    if inp.then_signal:
        await ctx.signal("go")
    else:
        # A timer after the wait (released or, when short enough, fired inline).
        await ctx.sleep(0.05)
    return {"event_id": got.event_id, "data": got.data, "key": got.key}


@workflow("ev-twice")
async def twice(ctx: WorkflowContext, inp: Waiter) -> list[str]:
    first = await ctx.wait_for_event("tick")
    second = await ctx.wait_for_event("tick")
    return [first.event_id, second.event_id]


@workflow("ev-private", access="owner")
async def private(ctx: WorkflowContext, inp: Waiter) -> str:
    got = await ctx.wait_for_event("private.ping")
    return got.event_id


@workflow("ev-private-start", access="owner", on_event="private.start")
async def private_start(ctx: WorkflowContext, order: Order) -> str:
    return order.order_id


REGISTRY = Registry(
    [eur_only, any_paid, shipped, retired_v1, retired_v2, strict, waiter, twice, private]
)
# Registered apart by the test that uses it: one more row in REGISTRY's registration
# transaction reorders GET /workflows' versions of equal first_registered_at.
PRIVATE_START = Registry([private_start])


@pytest.fixture
def esettings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, tmp_path, inline_retry_max_seconds=0.0)


async def _register(db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)


async def _finished(db: Database, run_id: str) -> Any:
    return await support.reach(db, TENANT, uuid.UUID(run_id), "completed", "failed")


async def test_trigger_starts_latest_matching_definitions(
    esettings: Settings, db: Database
) -> None:
    await _register(db)
    async with (
        support.api_client(esettings, db, TENANT) as client,
        support.workers(esettings, db, REGISTRY),
    ):
        # The filter reads the posted data, not the input model's defaults.
        eur = await client.post(
            "/events", json={"name": "order.paid", "data": {"order_id": "A", "currency": "EUR"}}
        )
        assert eur.status_code == 201, eur.text
        body = eur.json()
        assert eur.headers["Location"] == f"/events/{body['event_id']}"
        assert body["name"] == "order.paid" and body["key"] is None
        assert len(body["started_run_ids"]) == 2 and body["resumed_run_ids"] == []
        usd = await client.post(
            "/events", json={"name": "order.paid", "data": {"order_id": "B", "currency": "USD"}}
        )
        assert len(usd.json()["started_run_ids"]) == 1
        outputs = set()
        for rid in body["started_run_ids"] + usd.json()["started_run_ids"]:
            row = await _finished(db, rid)
            assert row["status"] == "completed" and row["created_by"] == "t"
            outputs.add(row["output"])
        assert outputs == {'"eur:A"', '"any:A"', '"any:B"'}
        # An event no workflow declares is recorded and starts nothing.
        none = await client.post("/events", json={"name": "nobody.cares", "data": [1, 2]})
        assert none.status_code == 201 and none.json()["started_run_ids"] == []
        got = await client.get(f"/events/{body['event_id']}")
        assert got.status_code == 200 and got.json() == body
        listed = (await client.get("/events", params={"name": "order.paid", "limit": 1})).json()
        assert [e["event_id"] for e in listed["items"]] == [usd.json()["event_id"]]
        more = await client.get(
            "/events",
            params={"name": "order.paid", "limit": 1, "page_token": listed["next_page_token"]},
        )
        assert [e["event_id"] for e in more.json()["items"]] == [body["event_id"]]
        retired = await client.get("/runs", params={"workflow": "ev-retired"})
        assert retired.json()["items"] == []
        # The trigger is shown with the definition, as the API evaluates it.
        listed_wf = {w["name"]: w for w in (await client.get("/workflows")).json()["items"]}
        (eur_version,) = listed_wf["ev-eur"]["versions"]
        assert eur_version["on_event"] == "order.paid"
        assert eur_version["event_filter"] == {"currency": "EUR"}
        assert [v["on_event"] for v in listed_wf["ev-retired"]["versions"]] == [None, "order.paid"]
        assert listed_wf["ev-waiter"]["versions"][0]["event_filter"] is None


async def test_key_is_idempotent_and_conflicts_on_another_body(
    esettings: Settings, db: Database
) -> None:
    await _register(db)
    async with support.api_client(esettings, db, TENANT) as client:
        first = await client.post(
            "/events",
            json={"name": "order.paid", "data": {"order_id": "K", "n": 1}, "key": "pay-1"},
        )
        assert first.status_code == 201
        # The same event in another key order and number spelling: the same request.
        again = await client.post(
            "/events",
            json={"name": "order.paid", "data": {"n": 1.0, "order_id": "K"}, "key": "pay-1"},
        )
        assert again.status_code == 200 and again.json() == first.json()
        runs = (await client.get("/runs", params={"workflow": "ev-any"})).json()["items"]
        assert len(runs) == 1
        other = await client.post(
            "/events",
            json={"name": "order.paid", "data": {"order_id": "L"}, "key": "pay-1"},
        )
        assert other.status_code == 409
        assert other.json()["code"] == "idempotency_key_reused"
        renamed = await client.post(
            "/events",
            json={"name": "order.shipped", "data": {"order_id": "K", "n": 1}, "key": "pay-1"},
        )
        assert renamed.status_code == 409
        assert len((await client.get("/events")).json()["items"]) == 1


async def test_same_key_at_once_starts_one_run(esettings: Settings, db: Database) -> None:
    await _register(db)
    async with support.api_client(esettings, db, TENANT) as client:
        body = {"name": "order.paid", "data": {"order_id": "C"}, "key": "race"}
        answers = await asyncio.gather(*(client.post("/events", json=body) for _ in range(4)))
        assert sorted(a.status_code for a in answers) == [200, 200, 200, 201]
        assert len({a.json()["event_id"] for a in answers}) == 1
        runs = (await client.get("/runs", params={"workflow": "ev-any"})).json()["items"]
        assert len(runs) == 1


async def test_wait_for_event_delivers_by_match_and_replays(
    esettings: Settings, db: Database
) -> None:
    await _register(db)
    a = await support.submit(db, esettings, REGISTRY, TENANT, "ev-waiter", order_id="1")
    b = await support.submit(
        db, esettings, REGISTRY, TENANT, "ev-waiter", order_id="2", then_signal=True
    )
    async with (
        support.api_client(esettings, db, TENANT) as client,
        support.workers(esettings, db, REGISTRY),
    ):
        for rid in (a, b):
            row = await support.reach(db, TENANT, rid, "waiting_event")
            assert (row["waiting_kind"], row["waiting_name"]) == ("event", "payment.done")
        waiting = await client.get("/runs", params={"waiting_on": "event:payment.done"})
        assert {r["run_id"] for r in waiting.json()["items"]} == {str(a), str(b)}
        miss = await client.post(
            "/events", json={"name": "payment.done", "data": {"order": {"id": "9"}}}
        )
        assert miss.json()["resumed_run_ids"] == []
        hit = await client.post(
            "/events",
            json={"name": "payment.done", "data": {"order": {"id": "2"}, "ok": True}, "key": "p2"},
        )
        assert hit.json()["resumed_run_ids"] == [str(b)]
        await support.reach(db, TENANT, b, "waiting_signal")
        sent = await client.post(f"/runs/{b}/signals/go", json={"payload": None})
        assert sent.status_code == 202, sent.text
        row = await _finished(db, str(b))
        assert row["status"] == "completed"
        out = (await client.get(f"/runs/{b}")).json()["output"]
        assert out == {
            "event_id": hit.json()["event_id"],
            "data": {"order": {"id": "2"}, "ok": True},
            "key": "p2",
        }
        # The same event again (same key): delivered nowhere new, b not resumed twice.
        again = await client.post(
            "/events",
            json={"name": "payment.done", "data": {"order": {"id": "2"}, "ok": True}, "key": "p2"},
        )
        assert again.status_code == 200 and again.json()["resumed_run_ids"] == [str(b)]
        assert (await client.get(f"/runs/{a}")).json()["status"] == "waiting_event"
        timeline = (await client.get(f"/runs/{b}/events")).json()["items"]
        delivered = [e for e in timeline if e["kind"] == "event_delivered"]
        assert len(delivered) == 1
        # Claimed to wait, again for the event, again for the signal: the last execution
        # replayed the wait from the journal, which gave it the same event.
        kinds = [e["kind"] for e in timeline]
        assert kinds.count("run_claimed") >= 3, kinds
        steps = (await client.get(f"/runs/{b}/steps")).json()["items"]
        (event_step,) = [s for s in steps if s["kind"] == "event"]
        assert (event_step["step_id"], event_step["status"]) == ("event:payment.done", "succeeded")


async def test_event_posted_before_the_wait_is_delivered(esettings: Settings, db: Database) -> None:
    await _register(db)
    run_id = await support.submit(db, esettings, REGISTRY, TENANT, "ev-waiter", order_id="7")
    async with support.api_client(esettings, db, TENANT) as client:
        # No worker yet: the run has not reached its wait, the event is kept for it.
        early = await client.post(
            "/events", json={"name": "payment.done", "data": {"order": {"id": "7"}}}
        )
        assert early.json()["resumed_run_ids"] == []
        async with support.workers(esettings, db, REGISTRY):
            row = await _finished(db, str(run_id))
        assert row["status"] == "completed"
        got = (await client.get(f"/events/{early.json()['event_id']}")).json()
        assert got["resumed_run_ids"] == [str(run_id)]
        out = (await client.get(f"/runs/{run_id}")).json()["output"]
        assert out["event_id"] == early.json()["event_id"]


async def test_one_event_per_wait_of_a_run(esettings: Settings, db: Database) -> None:
    await _register(db)
    run_id = await support.submit(db, esettings, REGISTRY, TENANT, "ev-twice", order_id="x")
    async with (
        support.api_client(esettings, db, TENANT) as client,
        support.workers(esettings, db, REGISTRY),
    ):
        await support.reach(db, TENANT, run_id, "waiting_event")
        one = (await client.post("/events", json={"name": "tick"})).json()
        assert one["resumed_run_ids"] == [str(run_id)]
        await support.reach(db, TENANT, run_id, "waiting_event")
        two = (await client.post("/events", json={"name": "tick"})).json()
        row = await _finished(db, str(run_id))
        assert row["status"] == "completed"
        out = (await client.get(f"/runs/{run_id}")).json()["output"]
        assert out == [one["event_id"], two["event_id"]]


async def test_wait_times_out_and_then_takes_nothing(esettings: Settings, db: Database) -> None:
    await _register(db)
    run_id = await support.submit(
        db, esettings, REGISTRY, TENANT, "ev-waiter", order_id="5", timeout=0.3
    )
    async with (
        support.api_client(esettings, db, TENANT) as client,
        support.workers(esettings, db, REGISTRY),
    ):
        row = await _finished(db, str(run_id))
        assert row["status"] == "completed"
        assert (await client.get(f"/runs/{run_id}")).json()["output"] == {"timed_out": True}
        late = await client.post(
            "/events", json={"name": "payment.done", "data": {"order": {"id": "5"}}}
        )
        assert late.json()["resumed_run_ids"] == []
        steps = (await client.get(f"/runs/{run_id}/steps")).json()["items"]
        assert [s["status"] for s in steps if s["kind"] == "event"] == ["timed_out"]


async def test_bad_input_is_refused_and_records_nothing(esettings: Settings, db: Database) -> None:
    await _register(db)
    async with support.api_client(esettings, db, TENANT) as client:
        bad = [
            ({"name": "order paid"}, 422),
            ({"name": ""}, 422),
            ({"name": "x" * 201}, 422),
            ({"name": 5}, 422),
            ({"name": "a\u0000b"}, 422),
            ({"name": "ördér"}, 422),
            ({"name": "ok", "key": 5}, 422),
            ({"name": "ok", "key": ""}, 422),
            ({"name": "ok", "key": "a\u0000b"}, 422),
            ({"name": "ok", "key": "k" * 256}, 422),
            ({"name": "ok", "extra": 1}, 422),
            ({"data": {}}, 422),
        ]
        for body, status in bad:
            answer = await client.post("/events", json=body)
            assert answer.status_code == status, (body, answer.text)
            assert answer.headers["content-type"].startswith("application/problem+json")
        surrogate = await client.post(
            "/events",
            content=b'{"name": "ok", "key": "\\ud800"}',
            headers={"Content-Type": "application/json"},
        )
        assert surrogate.status_code == 422
        for raw in (b'{"name": "ok", "data": {"n": NaN}}', b'{"name": "ok", "name": "ok"}'):
            answer = await client.post(
                "/events", content=raw, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code in (400, 422), raw
        malformed = await client.post(
            "/events", content=b'{"name": ', headers={"Content-Type": "application/json"}
        )
        assert malformed.status_code == 400
        huge = await client.post(
            "/events",
            json={"name": "ok", "data": {"blob": "x" * (esettings.max_payload_bytes + 10)}},
        )
        assert huge.status_code == 413
        # Data the triggered workflow's input schema refuses: 422 naming it, nothing kept.
        invalid = await client.post(
            "/events", json={"name": "invoice.sent", "data": {"amount": "x"}}
        )
        assert invalid.status_code == 422 and "ev-strict" in invalid.json()["detail"]
        assert (await client.get("/events")).json()["items"] == []
        # Odd but printable unicode in a key is a key like any other.
        odd = await client.post("/events", json={"name": "ok", "key": "ключ-✓-🙂"})
        assert odd.status_code == 201 and odd.json()["key"] == "ключ-✓-🙂"
        for missing in ("not-a-uuid", str(uuid.uuid4()), "%00"):
            assert (await client.get(f"/events/{missing}")).status_code == 404


async def test_scope_and_tenant_isolation(esettings: Settings, db: Database) -> None:
    await _register(db)
    async with support.api_client(esettings, db, TENANT) as client:
        posted = (
            await client.post("/events", json={"name": "order.paid", "data": {"order_id": "T"}})
        ).json()
        reader = DevTokens(DEV_SECRET).mint(
            tenant_id=TENANT, subject="r", scopes=frozenset({Scope.RUNS_READ})
        )
        refused = await client.post(
            "/events",
            json={"name": "order.paid", "data": {"order_id": "U"}},
            headers={"Authorization": f"Bearer {reader}"},
        )
        assert refused.status_code == 403
        assert refused.json()["required_scope"] == "events:write"
        seen = await client.get(
            f"/events/{posted['event_id']}", headers={"Authorization": f"Bearer {reader}"}
        )
        assert seen.status_code == 200
    async with support.api_client(esettings, db, "other-tenant") as other:
        assert (await other.get(f"/events/{posted['event_id']}")).status_code == 404
        assert (await other.get("/events")).json()["items"] == []
        # The other tenant's waits and triggers are its own: a same-named event there
        # starts its own runs, and never resumes this tenant's.
        theirs = (
            await other.post("/events", json={"name": "order.paid", "data": {"order_id": "T"}})
        ).json()
        assert len(theirs["started_run_ids"]) == 1  # ev-any (no currency for ev-eur)
        for rid in theirs["started_run_ids"]:
            assert (await other.get(f"/runs/{rid}")).status_code == 200
    async with support.api_client(esettings, db, TENANT) as client:
        for rid in theirs["started_run_ids"]:
            assert (await client.get(f"/runs/{rid}")).status_code == 404


async def test_only_the_owner_or_an_admin_reaches_an_owner_policy_wait(
    esettings: Settings, db: Database
) -> None:
    """Issue 34: a colleague's event resumed a private run his signal could not reach.

    An event reaches an ``access="owner"`` run only from its owner or an admin, as a
    signal does: not at the post (the wait is open) and not by a later wait's look-back
    (the event came first). Bob's events are left alone; alice's and root's resume.
    """
    await _register(db)
    # Not admin: admin tokens reach every run, whatever its policy.
    scopes = frozenset({Scope.EVENTS_WRITE, Scope.RUNS_READ, Scope.SIGNALS_WRITE})
    tokens = DevTokens(DEV_SECRET)
    async with (
        support.api_client(esettings, db, TENANT, subject="bob") as bob,
        support.api_client(esettings, db, TENANT, subject="alice") as alice,
        support.api_client(esettings, db, TENANT, subject="root") as root,
    ):
        bob.headers["Authorization"] = "Bearer " + tokens.mint(
            tenant_id=TENANT, subject="bob", scopes=scopes
        )
        alice.headers["Authorization"] = "Bearer " + tokens.mint(
            tenant_id=TENANT, subject="alice", scopes=scopes
        )
        run_id = await support.submit(
            db, esettings, REGISTRY, TENANT, "ev-private", subject="alice", order_id="p"
        )
        # Posted before the run reaches its wait: the look-back must not take it.
        early = (await bob.post("/events", json={"name": "private.ping"})).json()
        assert early["resumed_run_ids"] == []
        async with support.workers(esettings, db, REGISTRY):
            await support.reach(db, TENANT, run_id, "waiting_event")
            # Posted while it waits: not delivered either (his signal is 404).
            late = (await bob.post("/events", json={"name": "private.ping"})).json()
            assert late["resumed_run_ids"] == []
            signal = await bob.post(f"/runs/{run_id}/signals/go", json={})
            assert signal.status_code == 404
            run = (await alice.get(f"/runs/{run_id}")).json()
            assert run["status"] == "waiting_event", run
            timeline = (await alice.get(f"/runs/{run_id}/events")).json()["items"]
            assert "event_delivered" not in [e["kind"] for e in timeline]
            for event in (early, late):
                seen = (await alice.get(f"/events/{event['event_id']}")).json()
                assert seen["resumed_run_ids"] == [], seen

            # The owner's event resumes her run.
            hers = (await alice.post("/events", json={"name": "private.ping"})).json()
            assert hers["resumed_run_ids"] == [str(run_id)]
            assert (await _finished(db, str(run_id)))["status"] == "completed"
            result = (await alice.get(f"/runs/{run_id}/result")).json()
            assert result["output"] == hers["event_id"]

            # An admin of the tenant (another subject) reaches her next run too.
            second = await support.submit(
                db, esettings, REGISTRY, TENANT, "ev-private", subject="alice", order_id="q"
            )
            await support.reach(db, TENANT, second, "waiting_event")
            posted = (await root.post("/events", json={"name": "private.ping"})).json()
            assert posted["resumed_run_ids"] == [str(second)]
            assert (await _finished(db, str(second)))["status"] == "completed"
            result = (await alice.get(f"/runs/{second}/result")).json()
            assert result["output"] == posted["event_id"]
        assert (await bob.get(f"/events/{hers['event_id']}")).json()["resumed_run_ids"] == []


async def test_an_admins_earlier_event_is_looked_back_into_a_private_wait(
    esettings: Settings, db: Database
) -> None:
    # The look-back applies the rule as the post does: an admin's event counts.
    await _register(db)
    async with support.api_client(esettings, db, TENANT, subject="root") as root:
        run_id = await support.submit(
            db, esettings, REGISTRY, TENANT, "ev-private", subject="alice", order_id="r"
        )
        posted = (await root.post("/events", json={"name": "private.ping"})).json()
        async with support.workers(esettings, db, REGISTRY):
            assert (await _finished(db, str(run_id)))["status"] == "completed"
        result = (await root.get(f"/runs/{run_id}/result")).json()
        assert result["output"] == posted["event_id"]


async def test_a_trigger_starts_an_owner_policy_run_as_the_poster_submit_would(
    esettings: Settings, db: Database
) -> None:
    # The run is the poster's (created_by, access), invisible to a colleague, as the
    # run of a POST /runs would be.
    await _register(db)
    async with db.write() as conn:
        await PRIVATE_START.register(conn)
    scopes = frozenset({Scope.EVENTS_WRITE, Scope.RUNS_READ})
    tokens = DevTokens(DEV_SECRET)
    async with (
        support.api_client(esettings, db, TENANT, subject="bob") as bob,
        support.api_client(esettings, db, TENANT, subject="alice") as alice,
    ):
        bob.headers["Authorization"] = "Bearer " + tokens.mint(
            tenant_id=TENANT, subject="bob", scopes=scopes
        )
        alice.headers["Authorization"] = "Bearer " + tokens.mint(
            tenant_id=TENANT, subject="alice", scopes=scopes
        )
        posted = (
            await bob.post("/events", json={"name": "private.start", "data": {"order_id": "s"}})
        ).json()
        assert len(posted["started_run_ids"]) == 1, posted
        rid = posted["started_run_ids"][0]
        run = (await bob.get(f"/runs/{rid}")).json()
        assert (run["created_by"], run["access"]) == ("bob", "owner"), run
        assert (await alice.get(f"/runs/{rid}")).status_code == 404
        seen = (await alice.get(f"/events/{posted['event_id']}")).json()
        assert seen["started_run_ids"] == []


async def test_delivery_after_the_deadline_but_before_the_timeout_wins(
    esettings: Settings, db: Database
) -> None:
    # The deadline passes while no worker runs: the mailbox is still open, so a post
    # delivers into it, and the worker that handles the wait later takes the event
    # instead of timing out. One compare-and-set decides (docs/adr/0029-event-triggers.md).
    await _register(db)
    run_id = await support.submit(
        db, esettings, REGISTRY, TENANT, "ev-waiter", order_id="d", timeout=0.5
    )
    async with support.api_client(esettings, db, TENANT) as client:
        async with support.workers(esettings, db, REGISTRY):
            row = await support.reach(db, TENANT, run_id, "waiting_event")
        deadline = row["available_at"]
        assert deadline is not None

        async def past_deadline() -> bool:
            async with db.read() as conn:
                stmt = select(type_coerce(now_expr(conn.dialect.name), UtcDateTime()))
                now = (await conn.execute(stmt)).scalar_one()
            return bool(now > deadline)

        await wait_for(past_deadline, timeout=10, what="the wait's deadline passed")
        posted = await client.post(
            "/events", json={"name": "payment.done", "data": {"order": {"id": "d"}}}
        )
        assert posted.json()["resumed_run_ids"] == [str(run_id)]
        async with support.workers(esettings, db, REGISTRY):
            done = await _finished(db, str(run_id))
        assert done["status"] == "completed"
        out = (await client.get(f"/runs/{run_id}")).json()["output"]
        assert out["event_id"] == posted.json()["event_id"]


async def test_async_client_posts_and_reads_events(esettings: Settings, db: Database) -> None:
    await _register(db)
    async with support.api_client(esettings, db, TENANT) as http:
        treadle = AsyncTreadleClient("http://test", http_client=http)
        first = await treadle.post_event("order.paid", {"order_id": "Z"}, key="z-1")
        assert len(first.started_run_ids) == 1 and first.key == "z-1"
        again = await treadle.post_event("order.paid", {"order_id": "Z"}, key="z-1")
        assert again == first
        with pytest.raises(TreadleAPIError) as refused:
            await treadle.post_event("order.paid", {"order_id": "other"}, key="z-1")
        assert (refused.value.status, refused.value.code) == (409, "idempotency_key_reused")
        assert await treadle.get_event(first.event_id) == first
        with pytest.raises(TreadleAPIError) as missing:
            await treadle.get_event(uuid.uuid4())
        assert missing.value.code == "event_not_found"
        empty = await treadle.post_event("nobody.listens")
        assert empty.data == {} and empty.started_run_ids == []
