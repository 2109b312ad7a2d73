"""The ``GET /runs`` and ``GET /runs/counts`` queries: one set of filters for both.

Moved out of app/db/queries/runs.py when the filters grew (labels, reason, version,
finished time, waiting_on). Every filter is served by an index leading with
``tenant_id`` (docs/adr/0020-run-labels.md; tests/integration/test_list_filters_explain.py
checks PostgreSQL's plans).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.labels import LabelFilter
from app.db.queries.run_labels import label_conditions
from app.db.queries.runs import visible_to
from app.db.tables import runs


@dataclass(frozen=True, slots=True)
class RunListFilters:
    """The list filters, already validated by the API layer (None = not filtered).

    Attributes:
        workflow, status, reason, version: equality on the run's column.
        created_after, created_before: ``created_at`` in ``[after, before)`` (UTC).
        finished_after, finished_before: ``finished_at`` in ``[after, before)`` (UTC); a
            run that has not finished matches neither.
        idempotency_key: the run submitted with this key (at most one).
        waiting_kind, waiting_name: the run waits on this (``waiting_on=<kind>[:<name>]``;
            a None name matches any).
        labels: every one must match (AND).
    """

    workflow: str | None = None
    status: str | None = None
    reason: str | None = None
    version: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    idempotency_key: str | None = None
    waiting_kind: str | None = None
    waiting_name: str | None = None
    labels: Sequence[LabelFilter] = field(default_factory=tuple)


def list_filters(
    tenant_id: str, filters: RunListFilters, *, owner: str | None = None, status: bool = True
) -> list[Any]:
    """WHERE clauses of ``GET /runs`` and (``status=False``) ``GET /runs/counts``."""
    f = filters
    where: list[Any] = [runs.c.tenant_id == tenant_id, visible_to(owner)]
    if f.workflow is not None:
        where.append(runs.c.workflow == f.workflow)
    if status and f.status is not None:
        where.append(runs.c.status == f.status)
    if f.reason is not None:
        where.append(runs.c.reason == f.reason)
    if f.version is not None:
        where.append(runs.c.version == f.version)
    if f.created_after is not None:
        where.append(runs.c.created_at >= f.created_after)
    if f.created_before is not None:
        where.append(runs.c.created_at < f.created_before)
    if f.finished_after is not None:
        where.append(runs.c.finished_at >= f.finished_after)
    if f.finished_before is not None:
        where.append(runs.c.finished_at < f.finished_before)
    if f.idempotency_key is not None:
        # uq_runs_tenant_id_idempotency_key: at most one row, found by index.
        where.append(runs.c.idempotency_key == f.idempotency_key)
    if f.waiting_kind is not None:
        # ix_runs_tenant_id_waiting_run_id is partial (waiting_kind IS NOT NULL): an
        # equality on waiting_kind implies it, so the planner may use it.
        where.append(runs.c.waiting_kind == f.waiting_kind)
        if f.waiting_name is not None:
            where.append(runs.c.waiting_name == f.waiting_name)
    where.extend(label_conditions(f.labels))
    return where


def list_statement(
    tenant_id: str,
    filters: RunListFilters,
    *,
    before_run_id: uuid.UUID | None,
    limit: int,
    owner: str | None = None,
) -> Any:
    """The ``SELECT`` of :func:`list_runs` (also what the EXPLAIN test plans)."""
    stmt = select(runs).where(*list_filters(tenant_id, filters, owner=owner))
    if before_run_id is not None:
        stmt = stmt.where(runs.c.run_id < before_run_id)
    return stmt.order_by(runs.c.run_id.desc()).limit(limit)


def count_statement(tenant_id: str, filters: RunListFilters, *, owner: str | None = None) -> Any:
    """The ``SELECT`` of :func:`count_listed_by_status`."""
    where = list_filters(tenant_id, filters, owner=owner, status=False)
    return select(runs.c.status, func.count()).where(*where).group_by(runs.c.status)


async def list_runs(
    conn: AsyncConnection,
    tenant_id: str,
    filters: RunListFilters,
    *,
    before_run_id: uuid.UUID | None,
    limit: int,
    owner: str | None = None,
) -> Sequence[RowMapping]:
    """List a tenant's runs newest first with keyset pagination on the UUIDv7 run id.

    Keyset (``run_id < :before``) rather than OFFSET keeps pages stable while new runs are
    inserted: new ids sort above every page already served.
    """
    stmt = list_statement(tenant_id, filters, before_run_id=before_run_id, limit=limit, owner=owner)
    return (await conn.execute(stmt)).mappings().all()


async def count_listed_by_status(
    conn: AsyncConnection, tenant_id: str, filters: RunListFilters, *, owner: str | None = None
) -> dict[str, int]:
    """Runs per status among those ``list_runs`` would list with the same filters.

    ``filters.status`` is ignored (every status is counted). Only statuses some run is in
    appear. ``ix_runs_tenant_id_status_run_id`` serves the unfiltered grouping, so it
    reads the tenant's index entries, not its rows.
    """
    stmt = count_statement(tenant_id, filters, owner=owner)
    return {str(status): int(n) for status, n in (await conn.execute(stmt)).all()}
