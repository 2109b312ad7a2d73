"""A run's submission as one PostgreSQL statement: the run row and its event.

Submitting a run without a concurrency key writes (1) the ``runs`` row unless the
tenant's idempotency key is taken and (2) its ``run_submitted`` event, atomically. As
separate statements in an explicit transaction that is five round trips (pool pre-ping,
BEGIN, INSERT, INSERT, COMMIT) and two statements built per request; here it is one
statement of data-modifying CTEs (PostgreSQL "WITH queries", §7.8.4) built once and run
in autocommit, so the statement is its own transaction. ``submitted`` reads only ``FROM
inserted``: an idempotency-key twin (``ON CONFLICT DO NOTHING``) writes no event, and
the caller then reads the twin, exactly as :func:`app.db.queries.runs.insert_run` does.

The statement issues no NOTIFY: a transaction that did takes PostgreSQL's global
notification lock at commit, serializing all such commits. The caller asks the
per-process coalescer for a wake-up after it returns
(:meth:`app.db.database.Database.wake_workers`, docs/adr/0037-coalesced-wake-ups.md).

Runs with a concurrency key, child runs and SQLite keep the multi-statement transaction
(slot admission takes the key's lock first; a child joins its parent's transaction).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    ARRAY,
    Double,
    Integer,
    RowMapping,
    String,
    Text,
    Uuid,
    any_,
    bindparam,
    insert,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.status import EventKind, RunStatus
from app.db.dialect import now_expr, now_plus
from app.db.tables import events, metadata, run_labels, runs

_RUN_COLUMNS = ", ".join(c.name for c in runs.c)

_SUBMIT = (
    text(
        f"""WITH inserted AS (
    INSERT INTO runs (run_id, tenant_id, workflow, version, status, input, idempotency_key,
                      request_hash, created_by, api_key_id, access, priority,
                      trace_parent, trace_state, created_at, updated_at, available_at)
    VALUES (:run_id, :tenant_id, :workflow, :version, :status, :input, :idempotency_key,
            :request_hash, :created_by, :api_key_id, :access, :priority,
            :trace_parent, :trace_state,
            now(), now(), now() + make_interval(secs => :delay_seconds))
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING {_RUN_COLUMNS}
),
submitted AS (
    INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
    SELECT run_id, tenant_id, now(), :event_kind, NULL, created_by, :event_data
    FROM inserted
)
SELECT {_RUN_COLUMNS} FROM inserted"""
    )
    .bindparams(
        bindparam("run_id", type_=Uuid()),
        bindparam("tenant_id", type_=String()),
        bindparam("workflow", type_=String()),
        bindparam("version", type_=String()),
        bindparam("status", type_=String()),
        bindparam("input", type_=Text()),
        bindparam("idempotency_key", type_=String()),
        bindparam("request_hash", type_=String()),
        bindparam("created_by", type_=String()),
        bindparam("api_key_id", type_=Uuid()),
        bindparam("access", type_=String()),
        bindparam("priority", type_=Integer()),
        bindparam("trace_parent", type_=String()),
        bindparam("trace_state", type_=String()),
        bindparam("delay_seconds", type_=Double()),
        bindparam("event_kind", type_=String()),
        bindparam("event_data", type_=Text()),
    )
    # Typed result columns, matched by position: timestamps come back as aware UTC
    # datetimes exactly as from a Core ``select(runs)``.
    .columns(*runs.c)
)


async def submit_run(
    conn: AsyncConnection,
    *,
    run_id: uuid.UUID,
    tenant_id: str,
    workflow: str,
    version: str,
    input_text: str,
    idempotency_key: str | None,
    request_hash: str,
    created_by: str,
    api_key_id: uuid.UUID | None,
    access: str,
    priority: int,
    delay_seconds: float | None,
    event_data: str,
    trace_parent: str | None = None,
    trace_state: str | None = None,
) -> RowMapping | None:
    """Insert a ``queued`` run and its ``run_submitted`` event, as one statement (no NOTIFY).

    Run on an autocommit connection (PostgreSQL). ``available_at`` is the database clock
    plus ``delay_seconds`` (None or 0: now). ``event_data`` is the event's JSON text;
    ``trace_parent`` / ``trace_state`` the W3C trace context the run is submitted under.

    Returns:
        The inserted run row, or None when the tenant's ``idempotency_key`` is already
        taken (nothing was written; read the twin with
        :func:`app.db.queries.runs.get_by_idempotency_key`).
    """
    result = await conn.execute(
        _SUBMIT,
        {
            "run_id": run_id,
            "tenant_id": tenant_id,
            "workflow": workflow,
            "version": version,
            "status": RunStatus.QUEUED.value,
            "input": input_text,
            "idempotency_key": idempotency_key,
            "request_hash": request_hash,
            "created_by": created_by,
            "api_key_id": api_key_id,
            "access": access,
            "priority": priority,
            "trace_parent": trace_parent,
            "trace_state": trace_state,
            "delay_seconds": float(delay_seconds or 0.0),
            "event_kind": EventKind.RUN_SUBMITTED.value,
            "event_data": event_data,
        },
    )
    return result.mappings().first()


# --- Many runs at once (``POST /runs:batch``, docs/api.md "POST /runs:batch") ---


async def get_by_idempotency_keys(
    conn: AsyncConnection, tenant_id: str, keys: Sequence[str]
) -> dict[str, RowMapping]:
    """The tenant's runs submitted with any of ``keys``, by key (absent keys left out).

    PostgreSQL: one statement, ``idempotency_key = ANY(:keys)`` with the keys as one
    array parameter, so the statement text is the same for every batch (prepared once per
    connection) and is planned as one scan of the ``(tenant_id, idempotency_key)`` unique
    index. An expanded ``IN ($2, …, $501)`` was a new statement for each list length and
    took more time than the batch's INSERTs on a loaded machine (benchmarks/
    submit_batch.py, docs/benchmarks.md). SQLite has no arrays: ``IN`` in chunks of 500
    keys, well under its 32,766 bound parameters.
    """
    found: dict[str, RowMapping] = {}
    if not keys:
        return found
    if conn.dialect.name == "postgresql":
        stmt = select(runs).where(
            runs.c.tenant_id == tenant_id,
            runs.c.idempotency_key == any_(bindparam("keys", type_=ARRAY(String))),
        )
        result = await conn.execute(stmt, {"keys": list(keys)})
        for row in result.mappings():
            found[str(row["idempotency_key"])] = row
        return found
    for start in range(0, len(keys), 500):
        chunk = list(keys[start : start + 500])
        result = await conn.execute(
            select(runs).where(runs.c.tenant_id == tenant_id, runs.c.idempotency_key.in_(chunk))
        )
        for row in result.mappings():
            found[str(row["idempotency_key"])] = row
    return found


async def insert_runs(
    conn: AsyncConnection, rows: Sequence[dict[str, Any]], *, delay: float | None
) -> list[RowMapping | None]:
    """Insert ``queued`` runs sharing one ``delay`` as multi-row INSERTs, skipping taken keys.

    ``rows`` are ``runs`` column values (the same keys in every row, ``run_id`` included)
    without the timestamps: ``created_at``/``updated_at`` are the database clock and
    ``available_at`` that plus ``delay`` seconds, as :func:`app.db.queries.runs.insert_run`
    sets them. PostgreSQL: one ``INSERT … SELECT … FROM unnest(…) RETURNING`` statement
    with one array parameter per column (values sent as given: UUIDs, strings, integers;
    see ``_unnest_insert``). SQLite: SQLAlchemy's "insertmanyvalues", a few multi-row
    ``INSERT … RETURNING`` statements.

    ``ON CONFLICT (tenant_id, idempotency_key) DO NOTHING``, as
    :func:`app.db.queries.runs.insert_run` for ``POST /runs``: a row whose key the tenant
    already holds (committed before, or by a concurrent submit that commits first, which
    PostgreSQL waits for) is not inserted and comes back as None; the caller reads the
    twin. So no key needs reading before the INSERT and the key race raises nothing;
    any other constraint violation raises :class:`sqlalchemy.exc.IntegrityError` as it
    would for one run.

    Returns:
        Per row of ``rows``, in order, the inserted run or None (its key was taken).
    """
    if not rows:
        return []
    dialect = conn.dialect.name
    if dialect == "postgresql":
        columns = tuple(rows[0])
        sql = _unnest_insert(
            "runs",
            columns,
            computed={
                "created_at": "now()",
                "updated_at": "now()",
                "available_at": "now() + $1::interval",
            },
            tail=f"ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING {_RUN_COLUMNS}",
        )
        found = await conn.exec_driver_sql(
            sql, (timedelta(seconds=float(delay or 0.0)), *_arrays(rows, columns))
        )
        inserted = {row["run_id"]: row for row in found.mappings()}
        return [inserted.get(row["run_id"]) for row in rows]
    now = now_expr(dialect)
    start = now_plus(dialect, float(delay)) if delay else now
    stmt = (
        sqlite.insert(runs)
        .values(created_at=now, updated_at=now, available_at=start)
        .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"])
        .returning(*runs.c)
    )
    result = await conn.execute(stmt, list(rows))
    # Rows skipped by ON CONFLICT return nothing, so RETURNING cannot be matched by
    # position: matched by the run ids the caller generated.
    inserted = {row["run_id"]: row for row in result.mappings()}
    return [inserted.get(row["run_id"]) for row in rows]


# PostgreSQL: one ``INSERT … SELECT … FROM unnest($2::uuid[], $3::text[], …)`` per call,
# one array parameter per column, sent as given to asyncpg (which encodes arrays in C),
# through SQLAlchemy's driver-level execute: the same connection, transaction, prepared-
# statement cache and error wrapping (app/db/faults.py) as every other statement, without
# the per-row parameter processing of an "insertmanyvalues" INSERT (about half of the
# batch's INSERT time: docs/benchmarks.md). The statement text depends only on the
# columns, so it is prepared once per connection. Only columns whose values need no
# SQLAlchemy bind processing go this way (UUIDs, strings, integers: never UtcDateTime,
# whose timestamps here are the database clock). docs/adr/0042-batch-insert-on-the-driver.md.
_UNNEST_SQL: dict[tuple[str, tuple[str, ...]], str] = {}
_PG_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def _unnest_insert(
    table: str, columns: tuple[str, ...], *, computed: dict[str, str], tail: str
) -> str:
    # ``computed`` columns take SQL expressions (their parameters numbered first, as
    # the caller passes them); the others one array each, in ``columns`` order.
    key = (table, columns)
    sql = _UNNEST_SQL.get(key)
    if sql is None:
        c = metadata.tables[table].c
        first = 1 + sum(expr.count("$") for expr in computed.values())
        arrays = ", ".join(
            f"${first + i}::{c[name].type.compile(dialect=_PG_DIALECT)}[]"
            for i, name in enumerate(columns)
        )
        names = ", ".join(columns)
        sql = (
            f"INSERT INTO {table} ({names}, {', '.join(computed)}) "
            f"SELECT {names}, {', '.join(computed.values())} "
            f"FROM unnest({arrays}) AS item({names}) {tail}"
        )
        _UNNEST_SQL[key] = sql
    return sql


def _arrays(rows: Sequence[dict[str, Any]], columns: tuple[str, ...]) -> list[list[Any]]:
    return [[row[name] for row in rows] for name in columns]


async def append_submitted(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    """Append ``run_submitted`` events stamped with the database clock, multi-row.

    Each row holds ``run_id``, ``tenant_id``, ``actor`` and ``data`` (JSON text).
    PostgreSQL: one ``unnest`` INSERT, as :func:`insert_runs`.
    """
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        columns = ("run_id", "tenant_id", "actor", "data")
        sql = _unnest_insert(
            "events",
            columns,
            computed={"at": "now()", "kind": "$1", "step_id": "NULL"},
            tail="",
        )
        await conn.exec_driver_sql(sql, (EventKind.RUN_SUBMITTED.value, *_arrays(rows, columns)))
        return
    stmt = insert(events).values(
        at=now_expr(conn.dialect.name), kind=EventKind.RUN_SUBMITTED.value, step_id=None
    )
    await conn.execute(stmt, list(rows))


async def insert_labels_many(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    """Index new runs' labels (``run_id``, ``tenant_id``, ``key``, ``value`` rows)."""
    if rows:
        await conn.execute(insert(run_labels), list(rows))
