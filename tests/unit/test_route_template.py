"""Metric and log route labels keep the prefix a router was included under.

A black-box session saw console requests (``/ui/runs/{run_id}``) counted as the API's
``/runs/{run_id}`` in ``treadle_http_requests_total``: the installed FastAPI leaves the
router's own route, without its prefix, in the scope.
"""

from __future__ import annotations

import httpx
from fastapi import APIRouter, FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.access_log import route_template


async def test_prefixed_and_plain_routes_get_their_own_templates() -> None:
    seen: list[str] = []

    class Capture:
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await self.app(scope, receive, send)
            if scope["type"] == "http":
                seen.append(route_template(scope))

    app = FastAPI()
    console = APIRouter()

    @console.get("/runs/{run_id}")
    async def console_run(run_id: str) -> str:
        return run_id

    @app.get("/runs/{run_id}")
    async def api_run(run_id: str) -> str:
        return run_id

    app.include_router(console, prefix="/ui")
    app.add_middleware(Capture)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        assert (await client.get("/ui/runs/abc")).status_code == 200
        assert (await client.get("/runs/abc")).status_code == 200
        assert (await client.get("/nowhere")).status_code == 404
    assert seen == ["/ui/runs/{run_id}", "/runs/{run_id}", "unmatched"]
