"""The access log middleware: one line per request, route template, no secrets.

A small FastAPI app behind the same two middlewares as the API (``RequestId`` outside
``AccessLog``), called in-process over httpx's ASGI transport; lines are read with
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
from app.api.app import RequestId


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
    app.add_middleware(RequestId)
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
