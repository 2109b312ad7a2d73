"""Long-lived responses end when their credential does, over real HTTP (``treadle serve``).

Every long-lived response of the API re-checks the bearer token it was opened with
(docs/adr/0051-long-lived-responses-recheck-their-credential.md): an event stream
(``GET /runs/{id}/events?follow=true``) ends with an ``end`` message whose ``cause``
says why, a result long-poll (``GET /runs/{id}/result?wait=S``) answers what a new
request would get (401, 403). One test per cause: an API key revoked, a JWT that
expires (jwt mode, a token minted with a short ``exp``), a tenant suspended. The re-check
interval is short here (``TREADLE_AUTH_RECHECK_SECONDS``); nothing sleeps to wait: every
wait is a read with a deadline (heartbeats every 0.5 s keep the reads short).

The runs followed never end: no worker runs, so each stays queued.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc.jwk import KeySet

from app.auth.principal import ALL_SCOPES, Scope
from app.client import TreadleAPIError, TreadleClient
from app.core.settings import Settings
from app.db.database import Database
from app.engine.registry import Registry
from tests.acceptance.conftest import Stack, token
from tests.acceptance.test_event_stream import messages
from tests.acceptance.test_jwt_mode import AUD, ISS, KEY, idp_token
from tests.conftest import DEV_SECRET

RECHECK = 0.3
"""TREADLE_AUTH_RECHECK_SECONDS of these stacks."""
SLACK = 20.0
"""A loaded 2-core machine may be slow to answer, never this slow."""
USER_SCOPES = [s for s in ALL_SCOPES if s != Scope.ADMIN]


async def _register(database_url: str) -> None:
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    try:
        async with db.write() as conn:
            await Registry.from_modules(["tests.acceptance.handlers"]).register(conn)
    finally:
        await db.dispose()


def _env(stack_env: dict[str, str]) -> dict[str, str]:
    return {
        **stack_env,
        "TREADLE_AUTH_RECHECK_SECONDS": str(RECHECK),
        "TREADLE_EVENT_STREAM_HEARTBEAT_SECONDS": "0.5",
    }


@pytest.fixture
def cstack(database_url: str, tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    """A dev-mode stack with a short re-check interval and the acceptance workflows known."""
    asyncio.run(_register(database_url))
    s = Stack(database_url=database_url, tmp=tmp_path, env=_env(stack_env))
    try:
        s.start_api()
        yield s
    finally:
        s.stop()


@pytest.fixture
def jwt_cstack(database_url: str, tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    """The same in jwt mode (the provider's keys from a file), with no leeway past ``exp``."""
    asyncio.run(_register(database_url))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(KeySet([KEY]).as_dict(private=False)))
    env = {
        **_env(stack_env),
        "TREADLE_AUTH_MODE": "jwt",
        "TREADLE_JWT_ISSUER": ISS,
        "TREADLE_JWT_AUDIENCE": AUD,
        "TREADLE_JWT_JWKS_FILE": str(jwks),
        "TREADLE_JWT_LEEWAY_SECONDS": "0",
    }
    s = Stack(database_url=database_url, tmp=tmp_path, env=env)
    try:
        s.start_api()
        yield s
    finally:
        s.stop()


def _submit(stack: Stack, tok: str) -> str:
    with stack.client(tok) as c:
        resp = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": "x"}})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["run_id"])


def _long_poll(stack: Stack, run_id: str, tok: str) -> tuple[httpx.Response, float]:
    """``GET /runs/{id}/result?wait=120``: the answer and the wall-clock time it came."""
    with stack.client(tok) as c:
        resp = c.get(f"/runs/{run_id}/result", params={"wait": 120}, timeout=150)
        return resp, time.time()


class Follower:
    """One open ``follow=true`` stream, read message by message."""

    def __init__(self, resp: httpx.Response) -> None:
        assert resp.status_code == 200, resp.read()
        self.reading = messages(resp)
        # The opening comment: the server authenticated the request and the stream runs.
        assert "events of run" in next(self.reading).get("comment", "")

    def until_end(self, deadline: float) -> tuple[dict[str, Any], float]:
        """The ``end`` message's data and the wall-clock time it came (monotonic deadline)."""
        for msg in self.reading:
            if msg.get("event") == "end":
                return json.loads(msg["data"]), time.time()
            assert time.monotonic() < deadline, "the stream did not end in time"
        raise AssertionError("the stream closed without its end message")


def _stream(c: httpx.Client, stack: Stack, run_id: str, tok: str) -> Any:
    return c.stream(
        "GET",
        f"{stack.url}/runs/{run_id}/events",
        params={"follow": "true"},
        headers={"Authorization": f"Bearer {tok}"},
    )


def _in_flight(pool: ThreadPoolExecutor, stack: Stack, run_id: str, tok: str) -> Future[Any]:
    """Start a long-poll with ``tok`` in ``pool``.

    Started before the test opens and reads a stream, then changes the credential: the
    long-poll was sent first, so the server authenticated it before the change.
    """
    return pool.submit(_long_poll, stack, run_id, tok)


def test_a_revoked_api_key_ends_its_streams_and_long_polls(cstack: Stack) -> None:
    stack = cstack
    admin = token(scopes=["admin"])
    with stack.client(admin) as c:
        created = c.post(
            "/admin/api-keys", json={"name": "follower", "scopes": ["runs:read", "runs:write"]}
        )
        assert created.status_code == 201, created.text
    key, key_id = created.json()["api_key"], created.json()["key_id"]
    run_id = _submit(stack, key)
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=30) as c:
        poll = _in_flight(pool, stack, run_id, key)
        with _stream(c, stack, run_id, key) as resp:
            follower = Follower(resp)
            with stack.client(admin) as a:
                assert a.delete(f"/admin/api-keys/{key_id}").status_code == 200
            revoked_at = time.monotonic()
            with stack.client(key) as k:
                assert k.get("/runs").status_code == 401  # every new request: refused
            end, _ = follower.until_end(revoked_at + RECHECK + SLACK)
        assert end["cause"] == "credential_revoked"
        assert end["run_id"] == run_id and end["status"] == "queued"
        assert end["last_event_id"] >= 1
        answer, _ = poll.result(timeout=SLACK)
    assert answer.status_code == 401, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert answer.json()["code"] == "unauthenticated"


def test_a_suspended_tenant_ends_its_streams_and_long_polls(cstack: Stack) -> None:
    stack = cstack
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    user = token(tenant=tenant, subject="alice", scopes=USER_SCOPES)
    ops = token(tenant="ops", subject="ops-root", scopes=["admin"])
    run_id = _submit(stack, user)
    with (
        ThreadPoolExecutor(2) as pool,
        httpx.Client(timeout=30) as c,
        TreadleClient(stack.url, user, timeout=30) as client,
    ):
        poll = _in_flight(pool, stack, run_id, user)
        # The client library follows too: it yields the first event live, then raises.
        seen = client.follow_events(run_id)
        assert next(seen).kind == "run_submitted"
        rest = pool.submit(list, seen)
        with _stream(c, stack, run_id, user) as resp:
            follower = Follower(resp)
            with stack.client(ops) as o:
                done = o.post(f"/admin/tenants/{tenant}/suspend", json={"reason": "unpaid"})
                assert done.status_code == 200, done.text
            suspended_at = time.monotonic()
            end, _ = follower.until_end(suspended_at + RECHECK + SLACK)
        assert end["cause"] == "tenant_suspended" and end["run_id"] == run_id
        answer, _ = poll.result(timeout=SLACK)
        with pytest.raises(TreadleAPIError) as raised:
            rest.result(timeout=SLACK)
    assert answer.status_code == 403, answer.text
    assert answer.json()["code"] == "tenant_suspended"
    assert raised.value.code == "tenant_suspended" and raised.value.status == 403
    assert raised.value.problem["run_id"] == run_id


def test_an_expiring_jwt_ends_its_streams_and_long_polls_at_its_exp(jwt_cstack: Stack) -> None:
    stack = jwt_cstack
    run_id = _submit(stack, idp_token())
    # Long enough to open both responses on a loaded machine; the re-check interval
    # (0.3 s) is not what ends them: the expiry timer is.
    exp = int(time.time()) + 6
    short = idp_token(exp=exp)
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=30) as c:
        poll = _in_flight(pool, stack, run_id, short)
        with _stream(c, stack, run_id, short) as resp:
            follower = Follower(resp)
            end, ended_at = follower.until_end(time.monotonic() + (exp - time.time()) + SLACK)
        assert end["cause"] == "credential_expired" and end["run_id"] == run_id
        assert ended_at >= exp  # not before its time
        with stack.client(short) as k:
            assert k.get("/runs").status_code == 401  # as every new request
        answer, answered_at = poll.result(timeout=SLACK)
    assert answer.status_code == 401, answer.text
    assert answer.json()["code"] == "unauthenticated"
    assert answered_at >= exp
