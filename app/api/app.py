"""Composition root of the API process: ``create_app(settings)``."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from fastapi import FastAPI

from app.api import docs_pages, problems, query_params
from app.api.access_log import AccessLog
from app.api.request_guards import RequestGuards
from app.api.responses import AsciiJSONResponse
from app.api.routes import (
    admin,
    approvals,
    batches,
    dead_letters,
    events,
    health,
    maintenance,
    metrics,
    migrate,
    run_actions,
    run_logs,
    runs,
    schedules,
    tenants,
    webhooks,
    whoami,
    workflows,
)
from app.api.trace_requests import TraceRequests
from app.auth.authenticator import Authenticator
from app.auth.oidc import OidcSignIn
from app.auth.token_cache import TokenCache
from app.console import PREFIX as CONSOLE_PREFIX
from app.console import mount as mount_console
from app.console import problem_page as console_problem_page
from app.core import tracing
from app.core.settings import Settings
from app.core.tasks import cancel_and_wait
from app.db.database import Database
from app.db.migrations import check_schema
from app.db.pooler import statement_timeout_mismatch
from app.db.replica import ReplicaHeartbeat, heartbeat_interval
from app.db.statistics import StatisticsKeeper
from app.engine.api_keys import ApiKeyService
from app.engine.submit import Submitter
from app.engine.tenants import TenantService

API_VERSION = "0.1.0"
# Room for the envelope around a payload (workflow name, keys, JSON punctuation).
_ENVELOPE_BYTES = 64 * 1024


# FastAPI 0.16x traces every route itself once a global tracer provider exists; Treadle's
# traces are its own (app/core/tracing.py: one server span for POST /runs, whose context
# the run stores), so FastAPI's are turned off where the option exists
# (docs/adr/0026-traces-as-an-optional-extra.md).
_NO_NATIVE_TRACING: dict[str, Any] = (
    {"telemetry": {"tracing": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(
    settings: Settings,
    *,
    db: Database | None = None,
    on_wake: Callable[[], None] | None = None,
    check_schema_on_start: bool = True,
) -> FastAPI:
    """Build the FastAPI application.

    Args:
        settings: process settings.
        db: share a database with an in-process worker (``treadle dev``); default: own one,
            disposed at shutdown.
        on_wake: called after a run becomes due through the API (new run, signal,
            decision): the in-process worker wake-up of ``treadle dev``.
        check_schema_on_start: refuse to start unless the schema is at head.

    Raises:
        SchemaVersionMismatch: at start-up, when the schema is behind or ahead.
    """
    owns_db = db is None
    database = db or Database(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if check_schema_on_start:
            await check_schema(database)
            mismatch = await statement_timeout_mismatch(database)
            if mismatch is not None:
                structlog.get_logger("treadle.api").warning(mismatch)
        app.state.authenticator.start()
        # Batch submits are what fill a young database fastest: this process keeps the
        # planner's statistics up with them (app/db/statistics.py).
        stopping = asyncio.Event()
        tasks = [
            asyncio.create_task(
                StatisticsKeeper(database, settings.analyze_interval_seconds).run(stopping),
                name="statistics-keeper",
            )
        ]
        if database.has_replica:
            # The replica's lag is the age of this heartbeat there (app/db/replica.py,
            # docs/adr/0049-replica-lag-from-a-heartbeat.md); the first beat is written
            # before the first request, so a restart does not start on a stale-looking row.
            heartbeat = ReplicaHeartbeat(
                database, heartbeat_interval(settings.read_max_lag_seconds)
            )
            await heartbeat.beat_once()
            tasks.append(asyncio.create_task(heartbeat.run(stopping), name="replica-heartbeat"))
        try:
            yield
        finally:
            # Cancelled rather than awaited: a check stuck on an unreachable database must
            # not hold up the shutdown; an ANALYZE cut short rolls back and changes nothing.
            stopping.set()
            await cancel_and_wait(tasks)
            await app.state.authenticator.aclose()
        if owns_db:
            await database.dispose()

    app = FastAPI(
        **_NO_NATIVE_TRACING,
        title="Treadle",
        version=API_VERSION,
        summary="Durable workflows as a service.",
        description=(
            "Submit workflow runs, inspect them, wait for their results and read the "
            "operator's report. Errors are RFC 9457 problem details. Every request needs "
            "`Authorization: Bearer <token>` except the health probes."
        ),
        lifespan=lifespan,
        # Served by docs_pages from packaged assets: FastAPI's own pages load a CDN.
        docs_url=None,
        redoc_url=None,
        default_response_class=AsciiJSONResponse,
        license_info={"name": "Apache-2.0", "identifier": "Apache-2.0"},
        servers=[
            {
                "url": "http://127.0.0.1:8000",
                "description": "`treadle dev` / `treadle serve` on their default port; "
                "point clients at your deployment's URL",
            }
        ],
    )
    app.state.settings = settings
    app.state.db = database
    app.state.submitter = Submitter(database, settings)
    # One verified-token cache per process, told of every revocation made here
    # (docs/security.md#token-cache).
    token_cache = TokenCache(
        size=settings.auth_cache_size, ttl_seconds=settings.auth_cache_ttl_seconds
    )
    app.state.api_keys = ApiKeyService(database, on_revoke=token_cache.forget_api_key)
    app.state.tenants = TenantService(database, cache_seconds=settings.tenant_cache_seconds)
    app.state.authenticator = Authenticator(
        settings, api_keys=app.state.api_keys, tenants=app.state.tenants, cache=token_cache
    )
    jwt_verifier = app.state.authenticator.jwt_verifier
    # The console's OIDC sign-in shares the API's key cache (app.auth.oidc); None unless
    # TREADLE_OIDC_CLIENT_ID is set (which settings allow in jwt mode only).
    app.state.oidc_sign_in = (
        OidcSignIn(settings, jwt_verifier, cookie_secret=settings.console_secret)
        if settings.oidc_client_id and jwt_verifier is not None
        else None
    )
    app.state.on_wake = on_wake
    # Errors under /ui are the console's HTML pages, whichever layer raised them (an
    # exception handler or a request guard); everywhere else problem+json.
    pages = problems.ProblemPages({CONSOLE_PREFIX: console_problem_page})
    problems.install(app, pages)
    docs_pages.install(app)
    # Every API operation refuses a one-value query parameter given twice (422), read
    # from the route table (app.api.query_params); the console's pages too (mount below).
    for router in (
        runs.router,
        run_actions.router,
        run_logs.router,
        batches.router,
        events.router,
        approvals.router,
        migrate.router,
        dead_letters.router,
        workflows.router,
        admin.router,
        tenants.router,
        maintenance.router,
        schedules.router,
        health.router,
        metrics.router,
        whoami.router,
        webhooks.router,
    ):
        app.include_router(router, dependencies=[query_params.REFUSE_REPEATED])
    # The browser console under /ui (pages outside the OpenAPI document): it calls this
    # same app in-process with each user's own token (docs/console.md).
    mount_console(app, dependencies=[query_params.REFUSE_REPEATED])
    # Two layers of our own (docs/adr/0035-http-parser.md, "Middleware"): the request
    # guards (head and body size, body time, strict JSON) inside the access log, so each
    # refusal is logged with the request's id. Their refusals under /ui are the console's
    # pages (``pages``), which carry its security headers themselves.
    app.add_middleware(
        RequestGuards,
        body_limit=settings.max_payload_bytes + _ENVELOPE_BYTES,
        header_limit=settings.max_header_bytes,
        body_seconds=settings.body_read_timeout_seconds,
        pages=pages,
    )
    app.add_middleware(AccessLog)
    if tracing.ENABLED:
        # Outermost: the POST /runs span covers authentication and error responses too.
        app.add_middleware(TraceRequests)
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = problems.problem_media_type(generate())
            # Every operation needs the bearer token unless it says `security: []`.
            schema["security"] = [{name: []} for name in schema["components"]["securitySchemes"]]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def openapi_document(settings: Settings | None = None) -> dict[str, Any]:
    """Return the OpenAPI document of the app (for ``openapi/openapi.json``)."""
    app = create_app(
        settings or Settings(database_url="sqlite+aiosqlite:///:memory:", dev_secret="x" * 32),
        check_schema_on_start=False,
    )
    return app.openapi()
