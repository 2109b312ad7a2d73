"""Tenant suspension: suspend, resume and list tenants; the API's gate; the worker's re-check.

An operator suspends a tenant (``/admin/tenants``, ``treadle tenants``) to stop everything
done in its name at once (issue #5, DESIGN §4):

- the API refuses the tenant's principals with ``403 tenant_suspended``, except those
  holding ``admin`` (so operators cannot lock themselves out). Each API process keeps
  the set of suspended tenants for ``TREADLE_TENANT_CACHE_SECONDS``: a change made
  through another process reaches its requests within that window;
- every worker attempt re-checks the run's tenant in its claim statement
  (:func:`app.db.queries.runs.claim_runs`): a suspended tenant's run ends ``failed`` /
  ``failure_authorization`` like a run whose API key was revoked (payloads redacted in
  every read, a dead letter written). Waiting runs are caught at their next attempt.

A tenant without a row in ``tenants`` is active: tenants are not registered, they come
from token claims and API keys. Resuming lets new work in; the dead letters of runs that
failed meanwhile can be requeued and then run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import RowMapping

from app.auth.principal import Principal
from app.core.errors import InvalidInput, TenantSuspended
from app.core.ids import is_tenant_id
from app.core.status import RunReason
from app.db.database import Database
from app.db.queries import tenants as q
from app.engine.authority import API_KEY_REVOKED_CAUSE, TENANT_SUSPENDED_CAUSE
from app.engine.outcomes import Failed

audit_log = structlog.get_logger("treadle.audit")

MAX_REASON_CHARS = 1000


@dataclass(frozen=True, slots=True)
class TenantState:
    """A tenant's suspension state.

    Attributes:
        tenant_id: the tenant.
        status: ``active`` or ``suspended``.
        reason: why it was suspended (operators only; None when active).
        changed_by: subject of the last suspend or resume; None if never changed.
        changed_at: when (UTC, database clock); None if never changed.
        created_at: when its row was written first; None if it has none.
    """

    tenant_id: str
    status: str
    reason: str | None
    changed_by: str | None
    changed_at: datetime | None
    created_at: datetime | None

    @classmethod
    def of(cls, tenant_id: str, row: RowMapping | None) -> TenantState:
        """The state a ``tenants`` row says, or active for a tenant without one."""
        if row is None:
            return cls(tenant_id, q.ACTIVE, None, None, None, None)
        return cls(
            tenant_id=row["tenant_id"],
            status=row["status"],
            reason=row["reason"],
            changed_by=row["changed_by"],
            changed_at=row["changed_at"],
            created_at=row["created_at"],
        )


def check_tenant_id(tenant_id: str) -> str:
    """Return ``tenant_id`` if well formed (the rule of token claims: 1..128 of ``[A-Za-z0-9_.-]``).

    Raises:
        InvalidInput: malformed (422).
    """
    if not is_tenant_id(tenant_id):
        raise InvalidInput(
            "tenant must be 1..128 characters of letters, digits, _ . -",
            errors=[{"path": "tenant", "message": "invalid"}],
        )
    return tenant_id


def check_reason(reason: str) -> str:
    """Return a suspension reason if it is 1..1000 printable characters, not all blank.

    Raises:
        InvalidInput: empty, too long, or holding control characters such as NUL (422).
    """
    if not reason.strip() or len(reason) > MAX_REASON_CHARS or not reason.isprintable():
        raise InvalidInput(
            f"reason must be 1..{MAX_REASON_CHARS} printable characters",
            errors=[{"path": "reason", "message": "invalid"}],
        )
    return reason


class TenantService:
    """Suspend, resume, read and list tenants; refuse principals of suspended tenants.

    Args:
        db: the database.
        cache_seconds: how long :meth:`suspended_tenants` may serve its last read
            (``TREADLE_TENANT_CACHE_SECONDS``; 0 reads on every call). Changes made
            through this service clear it at once.

    Attributes:
        generation: how many suspends and resumes went through this service.
    """

    def __init__(self, db: Database, *, cache_seconds: float = 0.0) -> None:
        self.db = db
        self.cache_seconds = cache_seconds
        self._suspended: frozenset[str] | None = None
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()
        # Bumped by every suspend or resume through this service: the open event streams
        # and long-polls of this process re-check their credential at their next poll
        # (app/auth/credential_watch.py) instead of at their next interval.
        self.generation = 0

    async def suspend(self, *, tenant_id: str, reason: str, actor: str) -> TenantState:
        """Suspend a tenant (idempotent: a suspended tenant keeps its first reason).

        Logged to ``treadle.audit`` with the acting subject.

        Args:
            tenant_id: the tenant (it needs no row beforehand).
            reason: why, for operators (1..1000 printable characters).
            actor: the subject acting (``changed_by``).

        Returns:
            The tenant's state afterwards.

        Raises:
            InvalidInput: a malformed tenant id or reason (422); nothing is written.
        """
        check_tenant_id(tenant_id)
        check_reason(reason)
        async with self.db.write() as conn:
            await q.suspend(conn, tenant_id=tenant_id, reason=reason, actor=actor)
            row = await q.get_tenant(conn, tenant_id)
        self._suspended = None
        self.generation += 1
        audit_log.info("admin tenant suspended", subject=actor, tenant=tenant_id)
        return TenantState.of(tenant_id, row)

    async def resume(self, *, tenant_id: str, actor: str) -> TenantState:
        """Resume a suspended tenant (idempotent: an active tenant stays as it is).

        Logged to ``treadle.audit`` with the acting subject. Runs that failed while the
        tenant was suspended stay failed; requeue their dead letters to run them.

        Raises:
            InvalidInput: a malformed tenant id (422).
        """
        check_tenant_id(tenant_id)
        async with self.db.write() as conn:
            await q.resume(conn, tenant_id=tenant_id, actor=actor)
            row = await q.get_tenant(conn, tenant_id)
        self._suspended = None
        self.generation += 1
        audit_log.info("admin tenant resumed", subject=actor, tenant=tenant_id)
        return TenantState.of(tenant_id, row)

    async def get(self, tenant_id: str) -> TenantState:
        """A tenant's state (active, never changed, for a tenant without a row).

        Raises:
            InvalidInput: a malformed tenant id (422).
        """
        check_tenant_id(tenant_id)
        async with self.db.read() as conn:
            return TenantState.of(tenant_id, await q.get_tenant(conn, tenant_id))

    async def list_tenants(
        self, *, status: str | None = None, after: str | None = None, limit: int = 50
    ) -> Sequence[TenantState]:
        """Tenants an operator acted on, by id; ``after`` is the keyset (last id seen)."""
        async with self.db.read() as conn:
            rows = await q.list_tenants(conn, status=status, after=after, limit=limit)
        return [TenantState.of(r["tenant_id"], r) for r in rows]

    async def suspended_tenants(self) -> frozenset[str]:
        """The ids of suspended tenants, at most ``cache_seconds`` old.

        Why the whole set: suspended tenants are few, so one small read every
        ``cache_seconds`` per process serves every request of every tenant.
        """
        if self.cache_seconds <= 0:
            return await self._load()
        if self._fresh():
            assert self._suspended is not None
            return self._suspended
        async with self._lock:  # one read per expiry, however many requests wait on it
            if not self._fresh():
                self._suspended = await self._load()
                self._loaded_at = time.monotonic()
            assert self._suspended is not None
            return self._suspended

    def _fresh(self) -> bool:
        return (
            self._suspended is not None and time.monotonic() - self._loaded_at < self.cache_seconds
        )

    async def _load(self) -> frozenset[str]:
        async with self.db.read() as conn:
            return await q.suspended_ids(conn)

    async def ensure_active(self, principal: Principal) -> None:
        """Refuse a principal of a suspended tenant, unless it holds ``admin``.

        The ``admin`` exception keeps operators able to resume (and inspect) a tenant,
        even their own. The problem names the tenant, never the operator's reason.

        Raises:
            TenantSuspended: the principal's tenant is suspended (403).
        """
        if principal.is_admin:
            return
        if principal.tenant_id in await self.suspended_tenants():
            raise TenantSuspended(
                f"tenant {principal.tenant_id!r} is suspended", tenant=principal.tenant_id
            )


def attempt_refusal(run: Mapping[Any, Any]) -> Failed | None:
    """The outcome of an attempt its re-check refuses, or None when it may run.

    ``run`` is a row from the claim, which carries ``tenant_suspended`` and
    ``api_key_revoked`` (DESIGN §4: each worker attempt re-checks that the run's tenant
    is active and its submitting API key, if any, is not revoked). Either ends the run
    ``failed`` / ``failure_authorization``; ``error.cause`` says which, and the
    ``run_failed`` event carries it.
    """
    if run["tenant_suspended"]:
        return Failed(
            RunReason.FAILURE_AUTHORIZATION,
            {
                "type": "Unauthorized",
                "cause": TENANT_SUSPENDED_CAUSE,
                "message": f"the run's tenant {run['tenant_id']!r} is suspended",
            },
        )
    if run["api_key_revoked"]:
        return Failed(
            RunReason.FAILURE_AUTHORIZATION,
            {
                "type": "Unauthorized",
                "cause": API_KEY_REVOKED_CAUSE,
                "message": "the API key that submitted this run was revoked",
            },
        )
    return None
