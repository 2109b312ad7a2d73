"""The access log middleware: one line per request, route template, no secrets.

A small FastAPI app behind the API's access log middleware (which also carries the request
id), called in-process over httpx's ASGI transport; lines are read with
structlog's capture. The end-to-end check over uvicorn is tests/acceptance/test_log_story.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import httpx
import pytest
import structlog
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from app.api.access_log import CLIENT_CLOSED, AccessLog


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: str) -> dict[str, str]:
        return {"item_id": item_id}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("engine bug")

    app.add_middleware(AccessLog)
    return app


async def _requests(*calls: tuple[str, str, dict[str, str]]) -> list[MutableMapping[str, Any]]:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    # The request id reaches a line through the log context, as in the real pipeline.
    with structlog.testing.capture_logs([structlog.contextvars.merge_contextvars]) as logs:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for method, path, headers in calls:
                await client.request(method, path, headers=headers)
    return [line for line in logs if line["event"] == "request"]


async def test_one_line_per_request_with_the_route_template_and_request_id() -> None:
    secret = "Bearer sk-very-secret"
    lines = await _requests(
        ("GET", "/items/it-42?token=hunter2", {"Authorization": secret, "X-Request-ID": "r-1"}),
        ("GET", "/nowhere/it-42", {}),
        ("GET", "/boom", {}),
    )
    assert [(line["method"], line["route"], line["status"]) for line in lines] == [
        ("GET", "/items/{item_id}", 200),
        ("GET", "unmatched", 404),
        ("GET", "/boom", 500),
    ]
    assert lines[0]["request_id"] == "r-1"
    assert all(len(line["request_id"]) == 32 for line in lines[1:])
    assert {line["log_level"] for line in lines} == {"info"}
    for line in lines:
        assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
        assert line["client"] == "127.0.0.1"
        text = repr(line)
        for leak in ("it-42", "hunter2", "sk-very-secret", "Bearer"):
            assert leak not in text


async def test_probes_are_logged_at_debug() -> None:
    lines = await _requests(("GET", "/healthz", {}), ("GET", "/items/a", {}))
    assert [(line["route"], line["log_level"]) for line in lines] == [
        ("/healthz", "debug"),
        ("/items/{item_id}", "info"),
    ]


async def test_a_request_cancelled_before_answering_is_logged_as_client_closed() -> None:
    async def hangs(scope: Scope, receive: Receive, send: Send) -> None:
        raise asyncio.CancelledError

    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/x", "headers": []}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        raise AssertionError("nothing is sent")

    with structlog.testing.capture_logs() as logs, pytest.raises(asyncio.CancelledError):
        await AccessLog(hangs)(scope, receive, send)
    assert [(line["route"], line["status"], line["client"]) for line in logs] == [
        ("unmatched", CLIENT_CLOSED, None)
    ]


async def test_the_request_id_is_echoed_or_minted_on_the_response() -> None:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        echoed = await client.get("/items/a", headers={"X-Request-ID": "r-9"})
        minted = await client.get("/items/a")
        injected = await client.get("/items/a", headers={"X-Request-ID": "x" * 500})
    assert echoed.headers["x-request-id"] == "r-9"
    assert len(minted.headers["x-request-id"]) == 32
    assert len(injected.headers["x-request-id"]) == 32  # too long: not echoed
    assert echoed.headers.get_list("x-request-id") == ["r-9"]


def test_the_api_has_two_middleware_layers_of_its_own() -> None:
    """Access log (with the request id) outside the request guards, then the console's.

    docs/adr/0035-http-parser.md: each layer wraps receive or send once more per message.
    The console's header layer passes anything outside ``/ui`` straight through.
    """
    from app.api.app import create_app
    from app.api.request_guards import RequestGuards
    from app.api.trace_requests import TraceRequests
    from app.console.headers import ConsoleHeaders
    from app.core import tracing
    from app.core.settings import Settings

    app = create_app(
        Settings(database_url="sqlite+aiosqlite:///:memory:", dev_secret="x" * 32),
        check_schema_on_start=False,
    )
    expected: list[object] = [AccessLog, RequestGuards, ConsoleHeaders]
    if tracing.ENABLED:
        expected.insert(0, TraceRequests)
    layers: list[object] = [m.cls for m in app.user_middleware]
    assert layers == expected
