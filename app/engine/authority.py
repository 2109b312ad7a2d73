"""Whom work started outside a request acts for, and whether that principal may still act.

A run submitted over HTTP carries its principal: ``created_by`` (the subject),
``api_key_id`` (the API key, None for a JWT) and ``access`` (its definition's policy),
and each worker attempt re-checks it in the claim (app/db/queries/runs.py). Work started
later in the same principal's name must carry the same three and pass the same checks,
whatever starts it (docs/security.md, docs/adr/0010-principal-on-every-path.md):

- a schedule records its creator's principal; each fire re-checks it
  (:func:`refusals`) and records a refused tick as ``failed`` with the cause, instead
  of starting a run its first attempt would fail; the runs it does start carry the
  principal, so a key revoked afterwards fails them at their next attempt;
- a child run carries its parent's principal, and is at least as private as its parent
  (:meth:`app.core.status.AccessPolicy.stricter`);
- requeue, retry and resume keep the run's own principal (they change no column of it);
- a bulk action (a batch) records its creator's subject, owner filter, scopes and API
  key; each item a worker acts on is re-checked under them (:func:`principal_refusal`
  and the action's scope, app/engine/batches.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.queries import api_keys as api_keys_q
from app.db.queries import tenants as tenants_q

# The causes a refused attempt or fire names (the worker's re-check uses the same words,
# app/engine/tenants.py ``attempt_refusal``).
TENANT_SUSPENDED_CAUSE = "tenant_suspended"
API_KEY_REVOKED_CAUSE = "api_key_revoked"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a principal may not act now.

    Attributes:
        cause: ``tenant_suspended`` or ``api_key_revoked`` (stable, a metric label).
        detail: a sentence for people (names the tenant, never an operator's reason).
    """

    cause: str
    detail: str


async def refusals(
    conn: AsyncConnection, principals: Iterable[Mapping[Any, Any]]
) -> dict[Any, Refusal]:
    """Re-check principals carried by rows (schedules): two reads for any number of rows.

    Args:
        conn: any connection.
        principals: rows with ``schedule_id`` (the key of the result), ``tenant_id``
            and ``api_key_id`` (None when created with a JWT).

    Returns:
        ``{schedule_id: Refusal}`` for the rows whose principal may not act: its tenant
        is suspended (checked first, as the claim does) or its API key is revoked or
        gone. Rows that may act are absent.
    """
    rows = list(principals)
    suspended = await tenants_q.suspended_among(conn, [r["tenant_id"] for r in rows])
    key_ids: list[uuid.UUID] = [r["api_key_id"] for r in rows if r["api_key_id"] is not None]
    revoked = await api_keys_q.revoked_among(conn, key_ids)
    found: dict[Any, Refusal] = {}
    for row in rows:
        if row["tenant_id"] in suspended:
            found[row["schedule_id"]] = Refusal(
                TENANT_SUSPENDED_CAUSE, f"tenant {row['tenant_id']!r} is suspended"
            )
        elif row["api_key_id"] is not None and row["api_key_id"] in revoked:
            found[row["schedule_id"]] = Refusal(
                API_KEY_REVOKED_CAUSE,
                f"the API key {row['created_by']} that created this schedule was revoked",
            )
    return found


async def refusal(conn: AsyncConnection, row: Mapping[Any, Any]) -> Refusal | None:
    """:func:`refusals` for one row: the refusal, or None when its principal may act."""
    return (await refusals(conn, [row])).get(row["schedule_id"])


async def principal_refusal(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    subject: str,
    api_key_id: uuid.UUID | None,
    is_admin: bool,
) -> Refusal | None:
    """Whether a stored principal may still act, as its request would be let through.

    A request of a suspended tenant's principal is refused unless it holds ``admin``
    (app/api/deps.py ``get_principal``), and a revoked API key authenticates nothing: the
    same two rules, for work done later in the principal's name (a batch's items).

    Args:
        conn: any connection.
        tenant_id: the principal's tenant.
        subject: its subject (named in the detail).
        api_key_id: the API key it used, None for a JWT.
        is_admin: it holds ``admin`` (exempt from the tenant's suspension).

    Returns:
        The refusal (``tenant_suspended`` first, then ``api_key_revoked``), or None.
    """
    if not is_admin and await tenants_q.suspended_among(conn, [tenant_id]):
        return Refusal(TENANT_SUSPENDED_CAUSE, f"tenant {tenant_id!r} is suspended")
    if api_key_id is not None and await api_keys_q.revoked_among(conn, [api_key_id]):
        return Refusal(API_KEY_REVOKED_CAUSE, f"the API key {subject} was revoked")
    return None
