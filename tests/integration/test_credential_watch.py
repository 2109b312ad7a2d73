"""An event stream's credential re-check on both databases, driven in-process.

The stream's generator (:func:`app.api.event_stream.follow`) runs on a database that
counts its reads, with the app's own authenticator, API keys and tenants: once the
credential lapses the stream sends its ``end`` message and returns, and neither it nor
the credential's re-check reads the database again. A stream whose client goes away is
closed by its response, however it was suspended. Over real HTTP with every cause:
tests/acceptance/test_stream_credentials.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import types
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.types import Message

from app.api import event_stream
from app.api.app import create_app
from app.api.event_stream import EventStreamResponse, EventStreams
from app.auth.authenticator import Authenticator
from app.auth.credential_watch import CredentialWatch
from app.auth.principal import ALL_SCOPES
from app.core.settings import Settings
from app.db.database import Database
from app.engine.api_keys import ApiKeyService
from app.engine.tenants import TenantService
from tests.conftest import make_settings
from tests.integration.test_auth import REGISTRY, auth, tok

RECHECK = 0.05


class CountingDatabase(Database):
    """A :class:`Database` that counts the read transactions it opens."""

    reads = 0

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """:meth:`Database.read`, counted."""
        self.reads += 1
        async with super().read() as conn:
            yield conn


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    # A 0.05 s poll: the stream reads often, so a read after its end would show.
    return make_settings(
        database_url,
        tmp_path,
        auth_recheck_seconds=RECHECK,
        auth_cache_ttl_seconds=0.2,
        tenant_cache_seconds=0.2,
        event_stream_poll_seconds=0.05,
        event_stream_heartbeat_seconds=0.1,
    )


@pytest.fixture
async def counting(settings: Settings) -> AsyncIterator[CountingDatabase]:
    database = CountingDatabase(settings)
    yield database
    await database.dispose()


@pytest.fixture
async def app(settings: Settings, counting: CountingDatabase) -> FastAPI:
    async with counting.write() as conn:
        await REGISTRY.register(conn)
    return create_app(settings, db=counting, check_schema_on_start=False)


async def _run(app: FastAPI, token: str) -> uuid.UUID:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://treadle") as api:
        resp = await api.post(
            "/runs",
            json={"workflow": "auth-shared", "input": {"secret": "s"}},
            headers=auth(token),
        )
        assert resp.status_code == 201, resp.text
        return uuid.UUID(resp.json()["run_id"])


async def _watch(
    app: FastAPI, settings: Settings, token: str, recheck: float | None = None
) -> CredentialWatch:
    authenticator: Authenticator = app.state.authenticator
    verified = await authenticator.authenticate_verified(token)
    return CredentialWatch(
        authenticator,
        token,
        verified,
        recheck_seconds=settings.auth_recheck_seconds if recheck is None else recheck,
    )


def _follow(
    counting: CountingDatabase, settings: Settings, watch: CredentialWatch, run_id: uuid.UUID
) -> AsyncGenerator[bytes, None]:
    streams = EventStreams(10)
    return event_stream.follow(
        counting, streams, settings, watch, tenant_id="acme", run_id=run_id, after=0
    )


def _finished(frames: AsyncGenerator[bytes, None]) -> bool:
    """True once the generator finished or was closed: it can run no more code."""
    assert isinstance(frames, types.AsyncGeneratorType)
    return frames.ag_frame is None


async def _until_end(frames: AsyncGenerator[bytes, None]) -> dict[str, object]:
    deadline = time.monotonic() + 30
    async for frame in frames:
        if frame.startswith(b"event: end"):
            data = frame.decode().split("data: ", 1)[1].strip()
            body: dict[str, object] = json.loads(data)
            return body
        assert time.monotonic() < deadline, "the stream did not end"
    raise AssertionError("the stream returned without its end message")


@pytest.mark.parametrize("through", ["this process", "another process"])
async def test_a_revoked_key_ends_the_stream_and_nothing_reads_after(
    app: FastAPI, settings: Settings, counting: CountingDatabase, through: str
) -> None:
    keys: ApiKeyService = app.state.api_keys
    created = await keys.create(
        tenant_id="acme", name="follower", scopes=["runs:read"], created_by="test"
    )
    run_id = await _run(app, tok(scopes=ALL_SCOPES))
    # Through this process: seen at the next poll, so a 300 s interval cannot be what
    # ends the stream. Through another (a service of its own, as the CLI has): seen at
    # the next interval once this process's cached verification (0.2 s) is over.
    recheck = 300.0 if through == "this process" else RECHECK
    if through == "another process":
        keys = ApiKeyService(counting)
    watch = await _watch(app, settings, created.token, recheck)
    frames = _follow(counting, settings, watch, run_id)
    assert b"events of run" in await anext(frames)
    assert b"event: run_submitted" in await anext(frames)  # it reads: the stream is live
    await keys.revoke(tenant_id="acme", key_id=created.row["key_id"], actor="test")
    end = await _until_end(frames)
    reads = counting.reads
    assert end["cause"] == "credential_revoked" and end["status"] == "queued"
    with pytest.raises(StopAsyncIteration):
        await anext(frames)
    assert _finished(frames)  # finished: it can run no more
    assert counting.reads == reads  # nothing read after the end


@pytest.mark.parametrize("through", ["this process", "another process"])
async def test_a_suspended_tenant_ends_the_stream(
    app: FastAPI, settings: Settings, counting: CountingDatabase, through: str
) -> None:
    user = tok()
    run_id = await _run(app, user)
    recheck = 300.0 if through == "this process" else RECHECK
    watch = await _watch(app, settings, user, recheck)
    frames = _follow(counting, settings, watch, run_id)
    assert b"events of run" in await anext(frames)
    tenants: TenantService = app.state.tenants
    if through == "another process":
        tenants = TenantService(counting)
    await tenants.suspend(tenant_id="acme", reason="unpaid", actor="ops")
    end = await _until_end(frames)
    reads = counting.reads
    assert end["cause"] == "tenant_suspended"
    with pytest.raises(StopAsyncIteration):
        await anext(frames)
    assert counting.reads == reads


async def test_an_admin_token_is_exempt_from_suspension_as_on_any_request(
    app: FastAPI, settings: Settings, counting: CountingDatabase
) -> None:
    admin = tok(scopes=ALL_SCOPES)  # holds admin: the tenant gate lets it in
    run_id = await _run(app, admin)
    watch = await _watch(app, settings, admin)
    tenants: TenantService = app.state.tenants
    await tenants.suspend(tenant_id="acme", reason="unpaid", actor="ops")
    frames = _follow(counting, settings, watch, run_id)
    assert b"events of run" in await anext(frames)
    # Past three re-check intervals the admin's stream still runs (heartbeats every 0.1 s).
    deadline = time.monotonic() + 3 * RECHECK
    while time.monotonic() < deadline:
        frame = await asyncio.wait_for(anext(frames), 10)
        assert not frame.startswith(b"event: end"), frame
    await frames.aclose()
    assert await watch.lapsed() is None


async def test_a_disconnect_closes_the_stream_generator(
    app: FastAPI, settings: Settings, counting: CountingDatabase
) -> None:
    user = tok()
    run_id = await _run(app, user)
    streams = EventStreams(10)
    streams.acquire("acme")
    frames = event_stream.follow(
        counting,
        streams,
        settings,
        await _watch(app, settings, user),
        tenant_id="acme",
        run_id=run_id,
        after=0,
    )
    first_body, stuck = asyncio.Event(), asyncio.Event()

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            if first_body.is_set():
                # A client that stopped reading: the generator is held at its yield
                # (the run_submitted event) when the disconnect cancels the send.
                stuck.set()
                await asyncio.Event().wait()
            first_body.set()

    async def receive() -> Message:
        await stuck.wait()
        return {"type": "http.disconnect"}

    response = EventStreamResponse(frames, streams, "acme")
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}}
    await asyncio.wait_for(response(scope, receive, send), 30)
    assert _finished(frames)  # finished: it can run no more
    assert streams.open_count("acme") == 0
    reads = counting.reads
    with pytest.raises(StopAsyncIteration):
        await anext(frames)
    assert counting.reads == reads
