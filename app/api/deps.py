"""FastAPI dependencies: services on ``app.state`` and the authenticated principal."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, TypeVar

import structlog
from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.authenticator import Authenticator
from app.auth.credential_watch import CredentialWatch
from app.auth.principal import ACTION_SCOPES, Principal, RunAction, Scope
from app.core.errors import Forbidden, NotFoundError, Unauthenticated
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.engine.api_keys import ApiKeyService
from app.engine.submit import Submitter
from app.engine.tenants import TenantService

_bearer = HTTPBearer(
    auto_error=False, description="Bearer token: a JWT, or a per-tenant API key (trd_…)."
)
audit_log = structlog.get_logger("treadle.audit")

PUBLIC: dict[str, Any] = {"security": []}
"""``openapi_extra`` of the routes that take no token (probes, metrics): an empty
``security`` overrides the document-wide bearer requirement (OpenAPI 3.1, Operation
Object ``security``)."""


# The state getters are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency
# in a worker thread, a thread hop per request for a dictionary lookup.


async def get_db(request: Request) -> Database:
    """The process's :class:`Database`."""
    db: Database = request.app.state.db
    return db


async def get_settings(request: Request) -> Settings:
    """The process's :class:`Settings`."""
    settings: Settings = request.app.state.settings
    return settings


async def get_api_keys(request: Request) -> ApiKeyService:
    """The process's :class:`ApiKeyService`."""
    service: ApiKeyService = request.app.state.api_keys
    return service


async def get_tenants(request: Request) -> TenantService:
    """The process's :class:`TenantService`."""
    service: TenantService = request.app.state.tenants
    return service


async def get_submitter(request: Request) -> Submitter:
    """The process's :class:`Submitter`."""
    submitter: Submitter = request.app.state.submitter
    return submitter


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Authenticate the ``Authorization: Bearer`` token (the only place that does).

    A principal of a suspended tenant is refused here, before any route runs, unless it
    holds ``admin`` (see :mod:`app.engine.tenants`).

    Raises:
        Unauthenticated: missing, malformed, expired or forged token (401).
        TenantSuspended: the token's tenant is suspended (403).
    """
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthenticated("missing bearer token")
    authenticator: Authenticator = request.app.state.authenticator
    generation = authenticator.generation
    verified = await authenticator.authenticate_verified(credentials.credentials)
    # Kept for a long-lived response, which re-checks it while open (watch_credential).
    request.state.credential = (credentials.credentials, verified, generation)
    return verified.principal


def watch_credential(request: Request, settings: Settings) -> CredentialWatch:
    """The request's credential, to re-check while a long-lived response stays open.

    For the routes whose response outlives its request's authentication: an event
    stream, a result long-poll (docs/adr/0051-long-lived-responses-recheck-their-credential.md).
    Only valid after :func:`get_principal` ran for this request (any route taking a
    principal).
    """
    token, verified, generation = request.state.credential
    return CredentialWatch(
        request.app.state.authenticator,
        token,
        verified,
        recheck_seconds=settings.auth_recheck_seconds,
        generation=generation,
    )


def require(scope: Scope) -> Callable[..., Coroutine[Any, Any, Principal]]:
    """Dependency factory: the principal, provided it holds ``scope``.

    The returned dependency carries ``required_scope`` so tests can enumerate what each
    route needs from the app's own routes.

    Raises:
        Forbidden: the scope is missing (403, naming it).
    """

    async def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if not principal.has(scope):
            raise Forbidden(
                f"this operation needs the {scope.value!r} scope", required_scope=scope.value
            )
        return principal

    dependency.required_scope = scope  # type: ignore[attr-defined]
    return dependency


def require_action(action: RunAction) -> Callable[..., Coroutine[Any, Any, Principal]]:
    """:func:`require` of the scope ``action`` needs, read from :data:`ACTION_SCOPES`.

    Every route acting on existing runs, single or bulk, takes its principal from here,
    so a verb needs the same scope on every path (a test enumerates the routes).

    Raises:
        Forbidden: the scope is missing (403, naming it).
    """
    return require(ACTION_SCOPES[action])


def read_tenant(principal: Principal, tenant: str | None) -> str:
    """The tenant a list reads: the caller's, or with ``admin`` any named one (logged).

    Raises:
        Forbidden: another tenant named without the ``admin`` scope (403).
    """
    if tenant is None or tenant == principal.tenant_id:
        return principal.tenant_id
    if not principal.is_admin:
        raise Forbidden(
            "reading another tenant needs the 'admin' scope", required_scope=Scope.ADMIN.value
        )
    audit_log.info("admin cross-tenant read", subject=principal.subject, tenant=tenant)
    return tenant


async def visible_run(
    conn: AsyncConnection, principal: Principal, run_id: uuid.UUID, tenant: str | None = None
) -> RowMapping:
    """Load a run the principal may read: its tenant's, and its own if owner-policy.

    ``tenant`` names another tenant to read from (``admin`` only, logged; see
    :func:`read_tenant`): cross-tenant reads are explicit, so an admin token used without
    it is tenant-scoped like any other. ``admin`` also sees every owner's runs.

    Raises:
        RunNotFound: not visible (missing, another tenant's, another owner's): one body.
        Forbidden: ``tenant`` names another tenant without the ``admin`` scope.
    """
    tenant_id = read_tenant(principal, tenant)
    return await runs_q.get_run(conn, tenant_id, run_id, owner=principal.owner_filter)


T = TypeVar("T")


async def lagging_read_or_primary(
    db: Database, read: Callable[[AsyncConnection], Awaitable[T]]
) -> T:
    """``read(conn)`` on :meth:`Database.lagging_read`; never a false 404 for that.

    For the pages under one object (a run's steps, events, logs and report, a schedule's
    fires, a webhook's deliveries): ``read`` loads the object first (for a run,
    :func:`visible_run`), then its rows, on one connection, so the answer is one
    snapshot, perhaps seconds old (docs/adr/0033-lag-tolerant-reads-on-a-replica.md). An
    object the replica does not have yet (created a moment ago) is read again on the
    primary: a client never gets 404 for an object that exists, only a page that may
    trail it by the replica's lag.

    Raises:
        NotFoundError: the primary does not show the object to the caller either
            (``RunNotFound``, ``ScheduleNotFound``, ...).
    """
    try:
        async with db.lagging_read() as conn:
            return await read(conn)
    except NotFoundError:
        if not db.has_replica:
            raise
    async with db.read() as conn:
        return await read(conn)


TenantQuery = Annotated[
    str | None,
    Query(
        max_length=128,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="Read another tenant's data (scope `admin`; logged). Default: the "
        "caller's tenant.",
    ),
]


def wake_workers(request: Request) -> None:
    """Poke the in-process worker (``treadle dev``), if any, after work became due.

    PostgreSQL deployments are woken by NOTIFY (coalesced after a submit's commit,
    docs/adr/0037-coalesced-wake-ups.md; in the transaction elsewhere); SQLite has no
    LISTEN/NOTIFY, so the dev server wires its worker's ``wake`` here.
    """
    on_wake = getattr(request.app.state, "on_wake", None)
    if on_wake is not None:
        on_wake()


DB = Annotated[Database, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SubmitterDep = Annotated[Submitter, Depends(get_submitter)]
ApiKeysDep = Annotated[ApiKeyService, Depends(get_api_keys)]
TenantsDep = Annotated[TenantService, Depends(get_tenants)]
Admin = Annotated[Principal, Depends(require(Scope.ADMIN))]
RunsRead = Annotated[Principal, Depends(require(Scope.RUNS_READ))]
RunsWrite = Annotated[Principal, Depends(require(Scope.RUNS_WRITE))]
SignalsWrite = Annotated[Principal, Depends(require(Scope.SIGNALS_WRITE))]
EventsWrite = Annotated[Principal, Depends(require(Scope.EVENTS_WRITE))]
ApprovalsWrite = Annotated[Principal, Depends(require(Scope.APPROVALS_WRITE))]
# Principals of the actions on runs (ACTION_SCOPES decides each one's scope).
Cancels = Annotated[Principal, Depends(require_action(RunAction.CANCEL))]
Signals = Annotated[Principal, Depends(require_action(RunAction.SIGNAL))]
DecidesApprovals = Annotated[Principal, Depends(require_action(RunAction.DECIDE_APPROVAL))]
Resumes = Annotated[Principal, Depends(require_action(RunAction.RESUME))]
Retries = Annotated[Principal, Depends(require_action(RunAction.RETRY))]
Requeues = Annotated[Principal, Depends(require_action(RunAction.REQUEUE))]
Pauses = Annotated[Principal, Depends(require_action(RunAction.PAUSE))]
Unpauses = Annotated[Principal, Depends(require_action(RunAction.UNPAUSE))]
Reruns = Annotated[Principal, Depends(require_action(RunAction.RERUN))]
WebhooksManage = Annotated[Principal, Depends(require(Scope.WEBHOOKS_MANAGE))]
