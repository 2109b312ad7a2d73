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

from sqlalchemy import RowMapping, case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.labels import LabelFilter
from app.core.status import RunStatus
from app.db.queries.run_labels import label_conditions, label_match_count, label_probes
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
    tenant_id: str,
    filters: RunListFilters,
    *,
    owner: str | None = None,
    status: bool = True,
    label_probe: bool = False,
) -> list[Any]:
    """WHERE clauses of ``GET /runs`` and (``status=False``) ``GET /runs/counts``.

    ``label_probe``: prefix label filters as per-run probes (:func:`label_probes`), for
    a walk the caller wants driven from ``runs``.
    """
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
    if label_probe:
        # Equality stays an EXISTS: PostgreSQL walks its (tenant, key, value, run_id)
        # range and the status range side by side in run id order (a merge join that
        # the LIMIT stops), cheaper than a descent per run. A prefix's range is not in
        # run id order, so it is probed per run (label_probes).
        where.extend(label_conditions([x for x in f.labels if not x.prefix]))
        where.extend(label_probes([x for x in f.labels if x.prefix]))
    else:
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


def count_statement(
    tenant_id: str, filters: RunListFilters, *, limit: int, owner: str | None = None
) -> Any:
    """The ``SELECT`` of :func:`count_listed_by_status` for broad filters: a column per status.

    Each column walks the status's ``ix_runs_tenant_id_status_run_id`` range (tenant,
    status) and counts its matching runs up to ``limit + 1`` (a ``LIMIT``ed subquery),
    label filters checked per run (:func:`label_probes`), so a filter matching half of a
    million-run tenant costs what one matching ``limit`` runs does
    (docs/adr/0020-run-labels.md). A status no run of the tenant is in is one index
    probe. The walk reads about ``limit`` divided by the share of the status's runs that
    match: the caller uses it only when every label filter matches more than ``limit``
    runs (:func:`narrow_count_statement` otherwise).
    """
    where = list_filters(tenant_id, filters, owner=owner, status=False, label_probe=True)
    columns = []
    for status in RunStatus:
        capped = (
            select(runs.c.run_id)
            .where(*where, runs.c.status == status.value)
            .limit(limit + 1)
            .subquery(f"capped_{status.value}")
        )
        count = select(func.count()).select_from(capped).scalar_subquery()
        # A status no run of the tenant is in (most of them, usually) costs one probe of
        # the (tenant, status) index (ORDER BY run_id: the planner reads the index for it,
        # never the table).
        present = (
            select(runs.c.run_id)
            .where(runs.c.tenant_id == tenant_id, runs.c.status == status.value)
            .order_by(runs.c.run_id)
            .limit(1)
            .scalar_subquery()
        )
        columns.append(case((present.is_not(None), count), else_=0).label(status.value))
    return select(*columns)


def narrow_count_statement(
    tenant_id: str, filters: RunListFilters, *, owner: str | None = None
) -> Any:
    """Exact runs per status, for filters with a label matching at most the count limit.

    The planner drives it from that label's index range (known short), so it reads at
    most that many runs.
    """
    where = list_filters(tenant_id, filters, owner=owner, status=False)
    return select(runs.c.status, func.count()).where(*where).group_by(runs.c.status)


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Runs per status among those listed, each counted up to a limit.

    Attributes:
        counts: every status, with its count; a status in ``at_least`` reports ``limit``
            and has more runs than that.
        at_least: the statuses whose count reached the limit (their number is a lower
            bound), in status order.
        limit: the most runs counted per status (``TREADLE_RUN_COUNT_LIMIT``).
    """

    counts: dict[str, int]
    at_least: list[str]
    limit: int


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
    conn: AsyncConnection,
    tenant_id: str,
    filters: RunListFilters,
    *,
    limit: int,
    owner: str | None = None,
) -> StatusCounts:
    """Runs per status among those ``list_runs`` would list with the same filters.

    ``filters.status`` is ignored (every status is counted). A status with more than
    ``limit`` matching runs reports ``limit`` and is named in ``at_least``: the count
    stops there (:func:`count_statement`), which is what keeps it an index read of
    bounded length on any tenant.

    Raises:
        ValueError: ``limit`` is below 1.
    """
    if limit < 1:
        raise ValueError(f"the count limit must be at least 1, not {limit}")
    for label in filters.labels:
        # A label with at most ``limit`` runs bounds every status's count: count exactly,
        # from its index range.
        matching = await conn.execute(label_match_count(tenant_id, label, limit=limit + 1))
        if int(matching.scalar_one()) <= limit:
            stmt = narrow_count_statement(tenant_id, filters, owner=owner)
            found = {str(s): int(n) for s, n in (await conn.execute(stmt)).all()}
            counts = {s.value: found.get(s.value, 0) for s in RunStatus}
            return StatusCounts(counts=counts, at_least=[], limit=limit)
    row = (await conn.execute(count_statement(tenant_id, filters, limit=limit, owner=owner))).one()
    counts = {}
    at_least: list[str] = []
    for status, n in zip(RunStatus, row, strict=True):
        if int(n) > limit:
            at_least.append(status.value)
        counts[status.value] = min(int(n), limit)
    return StatusCounts(counts=counts, at_least=at_least, limit=limit)
