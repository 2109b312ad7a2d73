"""Queries on run labels: ``runs.labels`` (the view copy) and ``run_labels`` (the index).

Every label write goes through this module so the two never disagree: both change in
the caller's transaction (docs/adr/0020-run-labels.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import and_, exists, func, insert, literal, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.labels import MAX_LABELS, LabelFilter, prefix_upper_bound
from app.db.tables import run_labels, runs


def encode(labels: Mapping[str, str]) -> str | None:
    """``runs.labels`` text for ``labels``: JSON sorted by key, None if empty."""
    return json.dumps(dict(sorted(labels.items()))) if labels else None


def decode(text: str | None) -> dict[str, str]:
    """The labels of a ``runs.labels`` value (``{}`` for NULL)."""
    return dict(json.loads(text)) if text else {}


async def insert_labels(
    conn: AsyncConnection, *, run_id: uuid.UUID, tenant_id: str, labels: Mapping[str, str]
) -> None:
    """Index a new run's labels (its ``runs.labels`` copy was written with the row)."""
    if labels:
        await conn.execute(
            insert(run_labels),
            [
                {"run_id": run_id, "tenant_id": tenant_id, "key": k, "value": v}
                for k, v in labels.items()
            ],
        )


async def set_label(
    conn: AsyncConnection, *, run_id: uuid.UUID, tenant_id: str, key: str, value: str
) -> dict[str, str]:
    """Set (insert or replace) one label of a run; returns the run's labels after it.

    Takes the run row's lock (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite writers are
    serialized) so two writers never lose each other's keys in ``runs.labels``.

    Raises:
        ValueError: the run already has :data:`MAX_LABELS` labels and ``key`` is new.
    """
    stmt = select(runs.c.labels).where(runs.c.tenant_id == tenant_id, runs.c.run_id == run_id)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    current = decode((await conn.execute(stmt)).scalar_one())
    if key not in current and len(current) >= MAX_LABELS:
        raise ValueError(f"a run has at most {MAX_LABELS} labels; {key!r} would be one more")
    current[key] = value
    row = {"run_id": run_id, "tenant_id": tenant_id, "key": key, "value": value}
    upsert: Any
    if conn.dialect.name == "postgresql":
        upsert = postgresql.insert(run_labels).values(row)
    else:
        upsert = sqlite.insert(run_labels).values(row)
    upsert = upsert.on_conflict_do_update(
        index_elements=["tenant_id", "run_id", "key"], set_={"value": upsert.excluded.value}
    )
    await conn.execute(upsert)
    await conn.execute(
        update(runs)
        .where(runs.c.tenant_id == tenant_id, runs.c.run_id == run_id)
        .values(labels=encode(current))
    )
    return current


def _match(f: LabelFilter) -> Any:
    if f.prefix:
        return and_(run_labels.c.value >= f.value, run_labels.c.value < prefix_upper_bound(f.value))
    return run_labels.c.value == f.value


def label_probes(filters: Sequence[LabelFilter]) -> list[Any]:
    """:func:`label_conditions` as per-run probes: the same rows, a fixed plan shape.

    Each is a scalar subquery (``(SELECT 1 FROM run_labels WHERE … run_id = runs.run_id
    …) IS NOT NULL``), which PostgreSQL does not turn into a join: every candidate run
    costs one lookup of ``pk_run_labels`` (tenant_id, run_id, key), and a ``LIMIT`` on
    the outer walk bounds the whole statement. ``EXISTS`` leaves the planner free to hash
    one side whole first, which it does for a prefix whose range it thinks small.
    """
    return [
        select(literal(1))
        .where(
            run_labels.c.tenant_id == runs.c.tenant_id,
            run_labels.c.run_id == runs.c.run_id,
            run_labels.c.key == f.key,
            _match(f),
        )
        .scalar_subquery()
        .is_not(None)
        for f in filters
    ]


def label_match_count(tenant_id: str, f: LabelFilter, *, limit: int) -> Any:
    """``SELECT`` of how many of the tenant's runs carry label ``f``, counted up to ``limit``.

    One index-only range read of ``ix_run_labels_tenant_id_key_value_run_id`` that stops
    at ``limit`` entries.
    """
    capped = (
        select(run_labels.c.run_id)
        .where(run_labels.c.tenant_id == tenant_id, run_labels.c.key == f.key, _match(f))
        .limit(limit)
        .subquery("capped_label")
    )
    return select(func.count()).select_from(capped)


def label_conditions(filters: Sequence[LabelFilter]) -> list[Any]:
    """WHERE clauses on ``runs``: the run has every label filter's key and value.

    Each is an ``EXISTS`` on ``run_labels`` probing
    ``ix_run_labels_tenant_id_key_value_run_id`` with (tenant_id, key, value or value
    range, run_id): equality and prefix alike are index range reads, so the planner can
    drive the query from the labels or check them per run without reading other rows.
    """
    return [
        exists().where(
            run_labels.c.tenant_id == runs.c.tenant_id,
            run_labels.c.key == f.key,
            _match(f),
            run_labels.c.run_id == runs.c.run_id,
        )
        for f in filters
    ]
