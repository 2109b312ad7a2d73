"""Outbound webhooks on both databases: terminal-write deliveries, sender, API bad input.

Deliveries are written with the terminal state; the sender's attempts, backoff and fence;
the ``/webhooks`` API's bad input and tenant isolation.

docs/adr/0030-outbound-webhooks.md. The end-to-end case over real HTTP with worker
processes is tests/acceptance/test_webhooks_http.py.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel
from sqlalchemy import delete, select, update

from app.auth.dev import DevTokens
from app.auth.principal import Scope
from app.core import json
from app.core.settings import Settings
from app.db.database import Database, fetch_now
from app.db.queries import webhooks as webhooks_q
from app.db.tables import webhook_attempts, webhook_deliveries, webhook_endpoints
from app.engine import control
from app.engine import webhooks as engine
from app.engine.registry import Registry
from app.sdk import Permanent, WorkflowContext, workflow
from app.sdk.webhooks import verify_signature
from app.worker.webhooks import WebhookSender
from tests.conftest import DEV_SECRET, make_settings
from tests.integration import support

TENANT = "wh-t"
OTHER = "wh-other"
CLOSED = "http://127.0.0.1:9/hook"  # the discard port: nothing listens, the POST fails
_ids = itertools.count()


class Job(BaseModel):
    fail: bool = False


def finish(fail: bool) -> str:
    """Succeed, or fail for good."""
    if fail:
        raise Permanent(ValueError("refused"))
    return "done"


@workflow("wh-flow")
async def wh_flow(ctx: WorkflowContext, job: Job) -> str:
    return await ctx.step(finish, job.fail)


@workflow("wh-other-flow")
async def wh_other_flow(ctx: WorkflowContext, job: Job) -> str:
    return await ctx.step(finish, job.fail)


REGISTRY = Registry([wh_flow, wh_other_flow])


def _settings(database_url: str, tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "webhook_allow_private": True,
        "webhook_retry_delay_seconds": 3600.0,
        **overrides,
    }
    return make_settings(database_url, tmp_path, **values)


async def _endpoint(
    db: Database,
    settings: Settings,
    tenant: str,
    *,
    events: list[str] | None = None,
    workflow_name: str | None = None,
    url: str = CLOSED,
) -> uuid.UUID:
    row = await engine.create_endpoint(
        db,
        settings,
        tenant_id=tenant,
        subject="s",
        url=url,
        events=events,
        workflow=workflow_name,
    )
    return uuid.UUID(str(row["endpoint_id"]))


async def _deliveries(db: Database, endpoint_id: uuid.UUID) -> list[dict[str, object]]:
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(webhook_deliveries).where(webhook_deliveries.c.endpoint_id == endpoint_id)
            )
        ).mappings()
        return [dict(r) for r in rows]


async def test_each_terminal_state_writes_one_delivery_per_matching_endpoint(
    database_url: str, tmp_path: Path
) -> None:
    settings = _settings(database_url, tmp_path)
    db = Database(settings)
    try:
        every = await _endpoint(db, settings, TENANT)
        failed_only = await _endpoint(db, settings, TENANT, events=["failed"])
        other_flow = await _endpoint(db, settings, TENANT, workflow_name="wh-other-flow")
        other_tenant = await _endpoint(db, settings, OTHER)
        # Cancelled while queued (no worker yet): the cancel path writes its delivery.
        queued = await support.submit(db, settings, REGISTRY, TENANT, "wh-flow")
        await control.cancel(db, tenant_id=TENANT, run_id=queued, actor="a", reason="no")
        assert [d["run_status"] for d in await _deliveries(db, every)] == ["cancelled"]
        async with support.workers(settings, db, REGISTRY):
            # Completed: on PostgreSQL through the single-statement completion.
            done = await support.submit(db, settings, REGISTRY, TENANT, "wh-flow")
            failed = await support.submit(db, settings, REGISTRY, TENANT, "wh-flow", fail=True)
            await support.reach(db, TENANT, done, "completed")
            await support.reach(db, TENANT, failed, "failed")
        by_run = {d["run_id"]: d for d in await _deliveries(db, every)}
        assert set(by_run) == {queued, done, failed}
        assert by_run[done]["run_status"] == "completed"
        assert by_run[done]["run_reason"] == "succeeded"
        assert by_run[failed]["run_status"] == "failed"
        assert by_run[failed]["run_reason"] == "failure_non_retryable"
        assert by_run[queued]["run_reason"] == "canceled_by_request"
        for d in by_run.values():
            assert d["workflow"] == "wh-flow"
            assert d["state"] == "pending"
            assert d["finished_at"] is not None
        assert [d["run_id"] for d in await _deliveries(db, failed_only)] == [failed]
        assert await _deliveries(db, other_flow) == []
        assert await _deliveries(db, other_tenant) == []
    finally:
        await db.dispose()


class _Receiver:
    """An httpx transport answering 503 ``down`` times, then 200; keeps every request."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.requests: list[httpx.Request] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if len(self.requests) <= self.down:
            return httpx.Response(503)
        return httpx.Response(200)


async def _make_due(db: Database) -> None:
    async with db.write() as conn:
        now = await fetch_now(conn, conn.dialect.name)
        await conn.execute(
            update(webhook_deliveries)
            .where(webhook_deliveries.c.state == "pending")
            .values(next_attempt_at=now - timedelta(seconds=1))
        )


async def test_sender_retries_with_backoff_then_delivers_signed(
    database_url: str, tmp_path: Path
) -> None:
    settings = _settings(database_url, tmp_path, webhook_retry_delay_seconds=60.0)
    db = Database(settings)
    receiver = _Receiver(down=2)
    sender = WebhookSender(db, settings, worker_id="w-test")
    try:
        endpoint = await _endpoint(db, settings, TENANT, url="http://127.0.0.1:1/in?x=1")
        async with db.read() as conn:
            secret = (await webhooks_q.get_endpoint(conn, TENANT, endpoint))["secret"]
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "wh-flow")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="a", reason="no")
        async with httpx.AsyncClient(transport=httpx.MockTransport(receiver.handler)) as client:
            assert await sender.run_once(client) == 1  # 503
            # Backed off: not due again before its delay (60 s, jittered by up to 20%).
            assert await sender.run_once(client) == 0
            [row] = await _deliveries(db, endpoint)
            async with db.read() as conn:
                now = await fetch_now(conn, conn.dialect.name)
            assert row["next_attempt_at"] is not None
            wait = (row["next_attempt_at"] - now).total_seconds()  # type: ignore[operator]
            assert 45 < wait <= 60
            await _make_due(db)
            assert await sender.run_once(client) == 1  # 503 again
            [row] = await _deliveries(db, endpoint)
            wait = (row["next_attempt_at"] - now).total_seconds()  # type: ignore[operator]
            assert 90 < wait <= 121  # exponential: 120 s after the second failure
            await _make_due(db)
            assert await sender.run_once(client) == 1  # 200
            await _make_due(db)
            assert await sender.run_once(client) == 0  # delivered: never sent again
        [row] = await _deliveries(db, endpoint)
        assert row["state"] == "delivered"
        assert row["attempts"] == 3
        assert row["next_attempt_at"] is None
        async with db.read() as conn:
            attempts = (
                (await conn.execute(select(webhook_attempts).order_by(webhook_attempts.c.attempt)))
                .mappings()
                .all()
            )
        assert [(a["attempt"], a["http_status"]) for a in attempts] == [
            (1, 503),
            (2, 503),
            (3, 200),
        ]
        assert all(a["finished_at"] is not None for a in attempts)
        # Every attempt: same delivery id, the endpoint's path and Host, a valid signature.
        assert len(receiver.requests) == 3
        for request in receiver.requests:
            assert request.url.path == "/in" and request.url.query == b"x=1"
            assert request.headers["host"] == "127.0.0.1:1"
            assert verify_signature(secret, request.headers, request.content) == str(
                row["delivery_id"]
            )
        body = json.loads(receiver.requests[-1].content.decode())
        assert body["type"] == "run.cancelled"
        assert body["delivery_id"] == str(row["delivery_id"])
        data = body["data"]
        assert data["run_id"] == str(run_id)
        assert data["status"] == "cancelled"
        assert data["reason"] == "canceled_by_request"
        assert data["workflow"] == "wh-flow"
        assert "input" not in data and "output" not in data
    finally:
        await db.dispose()


async def test_attempts_run_out_and_a_lapsed_claim_writes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    settings = _settings(database_url, tmp_path, webhook_max_attempts=2)
    db = Database(settings)
    receiver = _Receiver(down=100)
    try:
        endpoint = await _endpoint(db, settings, TENANT, url="http://127.0.0.1:1/in")
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "wh-flow")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="a", reason="no")
        async with db.write() as conn:
            now = await fetch_now(conn, conn.dialect.name)
            [first] = await webhooks_q.claim_due(
                conn, worker_id="w1", now=now, lease_until=now - timedelta(seconds=1), limit=5
            )
        # Its claim lapsed (a sender killed mid-POST): another claims the next attempt.
        sender = WebhookSender(db, settings, worker_id="w2")
        async with httpx.AsyncClient(transport=httpx.MockTransport(receiver.handler)) as client:
            assert await sender.run_once(client) == 1
        # The first claim's late outcome is fenced off: nothing is written.
        async with db.write() as conn:
            assert not await webhooks_q.finish_attempt(
                conn,
                first,
                now=now,
                http_status=200,
                error=None,
                state="delivered",
                next_attempt_at=None,
            )
        [row] = await _deliveries(db, endpoint)
        assert row["state"] == "failed"  # attempt 2 of 2 answered 503
        assert row["attempts"] == 2
        async with db.read() as conn:
            attempts = (
                (await conn.execute(select(webhook_attempts).order_by(webhook_attempts.c.attempt)))
                .mappings()
                .all()
            )
        # The interrupted attempt stays without an outcome.
        assert [(a["attempt"], a["http_status"], a["finished_at"] is None) for a in attempts] == [
            (1, None, True),
            (2, 503, False),
        ]
    finally:
        await db.dispose()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("http://127.0.0.1:1/in", "loopback"),
        ("http://[2002:7f00:1::]:1/in", "6to4 address 2002:7f00:1:: carrying loopback"),
        ("http://[2002:a9fe:a9fe::]:1/in", "169.254.169.254"),
        ("http://[fec0::1]:1/in", "site-local"),
        ("http://[64:ff9b::a00:1]:1/in", "NAT64 address"),
        ("http://[::ffff:10.0.0.1]:1/in", "IPv4-mapped"),
    ],
)
async def test_send_time_guard_refuses_a_private_target(
    database_url: str, tmp_path: Path, url: str, named: str
) -> None:
    settings = _settings(database_url, tmp_path)
    db = Database(settings)
    receiver = _Receiver(down=0)
    try:
        endpoint = await _endpoint(db, settings, TENANT, url=url)
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "wh-flow")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="a", reason="no")
        # The setting is off by the time it is sent (as if DNS now pointed inside).
        strict = settings.model_copy(update={"webhook_allow_private": False})
        sender = WebhookSender(db, strict, worker_id="w")
        async with httpx.AsyncClient(transport=httpx.MockTransport(receiver.handler)) as client:
            assert await sender.run_once(client) == 1
        assert receiver.requests == []
        async with db.read() as conn:
            [attempt] = (await conn.execute(select(webhook_attempts))).mappings().all()
        assert attempt["http_status"] is None
        assert "refused" in attempt["error"] and named in attempt["error"], attempt["error"]
        assert (await _deliveries(db, endpoint))[0]["state"] == "pending"
    finally:
        await db.dispose()


async def test_send_time_guard_checks_the_address_it_connects_to(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name answers a public address at registration, then others.

    The resolver is the one seam replaced (a name under our control); each send resolves
    again, checks every answer, and the request goes to the checked address itself (the
    URL's host a literal, Host header and TLS name the name's), never to a second lookup.
    """
    answers: list[list[str]] = [["93.184.215.14"]]

    async def resolve(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
        assert host == "hooks.example.com"
        return [(0, 0, 0, "", (address, port)) for address in answers[0]]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", resolve)
    strict = _settings(database_url, tmp_path, webhook_allow_private=False)
    db = Database(strict)
    receiver = _Receiver(down=0)
    try:
        endpoint = await _endpoint(db, strict, TENANT, url="https://hooks.example.com:8443/in")
        run_id = await support.submit(db, strict, REGISTRY, TENANT, "wh-flow")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="a", reason="no")
        sender = WebhookSender(db, strict, worker_id="w")
        async with httpx.AsyncClient(transport=httpx.MockTransport(receiver.handler)) as client:
            for rebound in (["127.0.0.1"], ["93.184.215.14", "2002:a9fe:a9fe::"]):
                answers[0] = rebound  # one private answer among public ones is enough
                assert await sender.run_once(client) == 1
                await _make_due(db)
            assert receiver.requests == []
            answers[0] = ["2606:4700::1111", "93.184.215.14"]
            assert await sender.run_once(client) == 1
        [request] = receiver.requests
        assert request.url.host == "2606:4700::1111" and request.url.port == 8443
        assert request.headers["host"] == "hooks.example.com:8443"
        assert request.extensions["sni_hostname"] == "hooks.example.com"
        async with db.read() as conn:
            errors = [
                a["error"]
                for a in (
                    await conn.execute(
                        select(webhook_attempts).order_by(webhook_attempts.c.attempt)
                    )
                ).mappings()
            ]
        assert "loopback address 127.0.0.1" in errors[0]
        assert "6to4 address 2002:a9fe:a9fe::" in errors[1]
        assert errors[2] is None
        assert (await _deliveries(db, endpoint))[0]["state"] == "delivered"
    finally:
        await db.dispose()


async def test_webhooks_api_bad_input_and_tenant_isolation(
    database_url: str, tmp_path: Path
) -> None:
    settings = make_settings(database_url, tmp_path)  # the SSRF guard on
    db = Database(settings)
    try:
        async with (
            support.api_client(settings, db, TENANT) as client,
            support.api_client(settings, db, OTHER) as other,
        ):
            for url, code in [
                ("http://127.0.0.1/x", "webhook_target_refused"),
                ("http://10.0.0.8/x", "webhook_target_refused"),
                ("http://169.254.169.254/latest/meta-data", "webhook_target_refused"),
                ("http://[::1]/x", "webhook_target_refused"),
                ("http://[::ffff:127.0.0.1]/x", "webhook_target_refused"),
                ("http://[2002:7f00:1::]/x", "webhook_target_refused"),
                ("http://[2002:a9fe:a9fe::]/x", "webhook_target_refused"),
                ("http://[fec0::1]/x", "webhook_target_refused"),
                ("http://[64:ff9b::7f00:1]/x", "webhook_target_refused"),
                ("http://localhost:8000/x", "webhook_target_refused"),
                ("ftp://example.com/x", "webhook_target_refused"),
                ("not a url", "webhook_target_refused"),
                ("https://example.com/" + "a" * 3000, "webhook_target_refused"),
                ("https://example.com/\u0000", "webhook_target_refused"),
                ("https://example.com/\u202e", "webhook_target_refused"),
                ("", "invalid_request"),
                ("x" * 9000, "invalid_request"),
            ]:
                r = await client.post("/webhooks", json={"url": url})
                assert r.status_code == 422, (url, r.text)
                assert r.headers["content-type"].startswith("application/problem+json")
                assert r.json()["code"] == code, (url, r.json())
            r = await client.post("/webhooks", json={"url": "http://127.0.0.1/x"})
            assert "webhook targets must be public" in r.json()["detail"]
            for body in (
                {"url": "https://example.com/h", "events": ["succeeded"]},
                {"url": "https://example.com/h", "events": []},
                {"url": "https://example.com/h", "workflow": "bad name"},
                {"url": "https://example.com/h", "extra": 1},
                {"url": 5},
            ):
                r = await client.post("/webhooks", json=body)
                assert r.status_code == 422, (body, r.text)
            assert (await client.get("/webhooks")).json() == {"items": []}
        # A target the guard allows (private allowed by the setting): created, secret once.
        allowed = settings.model_copy(update={"webhook_allow_private": True})
        async with (
            support.api_client(allowed, db, TENANT) as client,
            support.api_client(allowed, db, OTHER) as other,
        ):
            r = await client.post(
                "/webhooks",
                json={"url": "http://127.0.0.1:9/in", "events": ["failed", "completed"]},
            )
            assert r.status_code == 201, r.text
            created = r.json()
            assert created["secret"].startswith("whsec_")
            assert created["events"] == ["completed", "failed"]
            wid = created["webhook_id"]
            assert r.headers["location"] == f"/webhooks/{wid}"
            got = (await client.get(f"/webhooks/{wid}")).json()
            assert "secret" not in got and got["url"] == "http://127.0.0.1:9/in"
            listed = (await client.get("/webhooks")).json()["items"]
            assert [w["webhook_id"] for w in listed] == [wid]
            assert "secret" not in listed[0]
            page = (await client.get(f"/webhooks/{wid}/deliveries")).json()
            assert page == {"items": [], "next_page_token": None}
            # Another tenant's id, an unknown id, a malformed id: 404, the same body shape.
            for path in (f"/webhooks/{wid}", f"/webhooks/{wid}/deliveries"):
                r = await other.get(path)
                assert r.status_code == 404 and r.json()["code"] == "webhook_not_found"
            assert (await other.delete(f"/webhooks/{wid}")).status_code == 404
            assert (await other.get("/webhooks")).json() == {"items": []}
            for bad in (str(uuid.uuid4()), "nope", "%00", "\u00e9" * 50):
                r = await client.get(f"/webhooks/{bad}")
                assert r.status_code == 404 and r.json()["code"] == "webhook_not_found"
            r = await client.get(f"/webhooks/{wid}/deliveries", params={"page_token": "x!"})
            assert r.status_code == 400
            r = await client.get(f"/webhooks/{wid}/deliveries", params={"limit": 0})
            assert r.status_code == 422
            assert (await client.delete(f"/webhooks/{wid}")).status_code == 204
            assert (await client.get(f"/webhooks/{wid}")).status_code == 404
            assert (await client.delete(f"/webhooks/{wid}")).status_code == 404
        # Without the scope: 403 naming it.
        app_client = support.api_client(allowed, db, TENANT)
        async with app_client as client:
            tok = DevTokens(DEV_SECRET).mint(
                tenant_id=TENANT, subject="t", scopes=frozenset({Scope.RUNS_READ})
            )
            r = await client.get("/webhooks", headers={"Authorization": f"Bearer {tok}"})
            assert r.status_code == 403
            assert r.json()["required_scope"] == "webhooks:manage"
    finally:
        await db.dispose()


@pytest.mark.parametrize("count", [3])
async def test_delivery_log_pages(database_url: str, tmp_path: Path, count: int) -> None:
    settings = _settings(database_url, tmp_path)
    db = Database(settings)
    try:
        endpoint = await _endpoint(db, settings, TENANT)
        runs = []
        for _ in range(count):
            run_id = await support.submit(db, settings, REGISTRY, TENANT, "wh-flow")
            await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="a", reason="no")
            runs.append(str(run_id))
        seen: list[str] = []
        async with support.api_client(settings, db, TENANT) as client:
            params: dict[str, str | int] = {"limit": 2}
            while True:
                page = (await client.get(f"/webhooks/{endpoint}/deliveries", params=params)).json()
                seen += [d["run_id"] for d in page["items"]]
                for d in page["items"]:
                    assert d["state"] == "pending" and d["attempts"] == []
                    assert d["run_status"] == "cancelled"
                if page["next_page_token"] is None:
                    break
                params = {"limit": 2, "page_token": page["next_page_token"]}
        assert seen == list(reversed(runs))
    finally:
        await db.dispose()


async def test_a_delivery_whose_endpoint_is_gone_is_never_claimed(
    database_url: str, tmp_path: Path
) -> None:
    settings = _settings(database_url, tmp_path)
    db = Database(settings)
    receiver = _Receiver(down=0)
    try:
        endpoint = await _endpoint(db, settings, TENANT, url="http://127.0.0.1:1/in")
        run_id = await support.submit(db, settings, REGISTRY, TENANT, "wh-flow")
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="a", reason="no")
        # As if the endpoint's deletion committed between a terminal write's read of the
        # endpoints and its insert: the row exists, its endpoint does not.
        async with db.write() as conn:
            await conn.execute(
                delete(webhook_endpoints).where(webhook_endpoints.c.endpoint_id == endpoint)
            )
        assert len(await _deliveries(db, endpoint)) == 1
        sender = WebhookSender(db, settings, worker_id="w")
        async with httpx.AsyncClient(transport=httpx.MockTransport(receiver.handler)) as client:
            assert await sender.run_once(client) == 0
        assert receiver.requests == []
    finally:
        await db.dispose()
