"""FastAPI dependencies: services on ``app.state`` and the authenticated principal."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth.authenticator import Authenticator
from app.auth.principal import Principal, Scope
from app.core.errors import Forbidden, Unauthenticated
from app.core.settings import Settings
from app.db.database import Database
from app.engine.submit import Submitter

_bearer = HTTPBearer(auto_error=False, description="Bearer token (JWT).")


def get_db(request: Request) -> Database:
    """The process's :class:`Database`."""
    db: Database = request.app.state.db
    return db


def get_settings(request: Request) -> Settings:
    """The process's :class:`Settings`."""
    settings: Settings = request.app.state.settings
    return settings


def get_submitter(request: Request) -> Submitter:
    """The process's :class:`Submitter`."""
    submitter: Submitter = request.app.state.submitter
    return submitter


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Authenticate the ``Authorization: Bearer`` token (the only place that does).

    Raises:
        Unauthenticated: missing, malformed, expired or forged token (401).
    """
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthenticated("missing bearer token")
    authenticator: Authenticator = request.app.state.authenticator
    return await authenticator.authenticate(credentials.credentials)


def require(scope: Scope) -> Callable[..., Coroutine[Any, Any, Principal]]:
    """Dependency factory: the principal, provided it holds ``scope``.

    Raises:
        Forbidden: the scope is missing (403, naming it).
    """

    async def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if not principal.has(scope):
            raise Forbidden(
                f"this operation needs the {scope.value!r} scope", required_scope=scope.value
            )
        return principal

    return dependency


def wake_workers(request: Request) -> None:
    """Poke the in-process worker (``treadle dev``), if any, after work became due.

    PostgreSQL deployments are woken by NOTIFY in the same transaction; SQLite has no
    LISTEN/NOTIFY, so the dev server wires its worker's ``wake`` here.
    """
    on_wake = getattr(request.app.state, "on_wake", None)
    if on_wake is not None:
        on_wake()


DB = Annotated[Database, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
SubmitterDep = Annotated[Submitter, Depends(get_submitter)]
RunsRead = Annotated[Principal, Depends(require(Scope.RUNS_READ))]
RunsWrite = Annotated[Principal, Depends(require(Scope.RUNS_WRITE))]
RunsCancel = Annotated[Principal, Depends(require(Scope.RUNS_CANCEL))]
SignalsWrite = Annotated[Principal, Depends(require(Scope.SIGNALS_WRITE))]
ApprovalsWrite = Annotated[Principal, Depends(require(Scope.APPROVALS_WRITE))]
Admin = Annotated[Principal, Depends(require(Scope.ADMIN))]
