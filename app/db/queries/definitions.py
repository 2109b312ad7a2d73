"""Queries on ``workflow_definitions`` and ``workers``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import RowMapping, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.db.dialect import now_expr, now_plus
from app.db.tables import workers, workflow_definitions


def _insert(conn: AsyncConnection, table: Any) -> Any:
    return (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(table)


async def upsert_definition(
    conn: AsyncConnection,
    *,
    name: str,
    version: str,
    kind: str,
    input_schema: str,
    output_schema: str,
    access: str = "tenant",
    states: str | None = None,
    queue_controls: str | None = None,
    graph: str | None = None,
    on_event: str | None = None,
    event_filter: str | None = None,
) -> None:
    """Register (or refresh) one workflow definition version.

    ``access`` is its access policy (``tenant`` or ``owner``); ``states`` is a state
    machine's JSON list of states and ``graph`` a DAG's JSON list of nodes (None for other
    kinds); ``queue_controls`` the JSON of
    :meth:`app.sdk.queue.QueueControls.to_json` (None: the defaults); ``on_event`` and
    ``event_filter`` (JSON) its event trigger (None: no event starts it).
    """
    now = now_expr(conn.dialect.name)
    stmt = _insert(conn, workflow_definitions).values(
        name=name,
        version=version,
        kind=kind,
        input_schema=input_schema,
        output_schema=output_schema,
        access=access,
        states=states,
        graph=graph,
        queue_controls=queue_controls,
        on_event=on_event,
        event_filter=event_filter,
        first_registered_at=now,
        last_registered_at=now,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["name", "version"],
        set_={
            "kind": kind,
            "input_schema": input_schema,
            "output_schema": output_schema,
            "access": access,
            "states": states,
            "graph": graph,
            "queue_controls": queue_controls,
            "on_event": on_event,
            "event_filter": event_filter,
            "last_registered_at": now,
        },
    )
    await conn.execute(stmt)


async def get_definitions(conn: AsyncConnection, name: str) -> Sequence[RowMapping]:
    """Every registered version of one workflow."""
    stmt = select(workflow_definitions).where(workflow_definitions.c.name == name)
    return (await conn.execute(stmt)).mappings().all()


async def list_definitions(conn: AsyncConnection) -> Sequence[RowMapping]:
    """Every registered definition, by name then first registration."""
    stmt = select(workflow_definitions).order_by(
        workflow_definitions.c.name, workflow_definitions.c.first_registered_at
    )
    return (await conn.execute(stmt)).mappings().all()


async def upsert_worker(
    conn: AsyncConnection,
    *,
    worker_id: str,
    hostname: str,
    pid: int,
    concurrency: int,
    definitions: str,
) -> None:
    """Record a starting worker and the definitions it can run (JSON list)."""
    now = now_expr(conn.dialect.name)
    stmt = _insert(conn, workers).values(
        worker_id=worker_id,
        hostname=hostname,
        pid=pid,
        concurrency=concurrency,
        definitions=definitions,
        started_at=now,
        last_heartbeat_at=now,
        stopped_at=None,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["worker_id"],
        set_={"last_heartbeat_at": now, "stopped_at": None, "definitions": definitions},
    )
    await conn.execute(stmt)


async def touch_worker(conn: AsyncConnection, worker_id: str) -> None:
    """Heartbeat of the worker process itself."""
    await conn.execute(
        update(workers)
        .where(workers.c.worker_id == worker_id)
        .values(last_heartbeat_at=now_expr(conn.dialect.name))
    )


async def stop_worker(conn: AsyncConnection, worker_id: str) -> None:
    """Mark a worker stopped (graceful shutdown)."""
    await conn.execute(
        update(workers)
        .where(workers.c.worker_id == worker_id)
        .values(stopped_at=now_expr(conn.dialect.name))
    )


async def live_workers(conn: AsyncConnection, *, within_seconds: float) -> Sequence[RowMapping]:
    """Workers that heartbeated within ``within_seconds`` and have not stopped."""
    stmt = select(workers).where(
        workers.c.stopped_at.is_(None),
        workers.c.last_heartbeat_at >= now_plus(conn.dialect.name, -within_seconds),
    )
    return (await conn.execute(stmt)).mappings().all()


async def blocked_reason(
    conn: AsyncConnection, *, workflow: str, version: str, within_seconds: float
) -> str | None:
    """Why a claimable run of ``workflow@version`` cannot progress, or None.

    A run is pinned to its definition version; if no live worker registered that exact
    version, nothing will ever claim it, and the run says so instead of sitting silently.
    """
    key = f"{workflow}@{version}"
    for worker in await live_workers(conn, within_seconds=within_seconds):
        if key in json.loads(worker["definitions"]):
            return None
    return f"no live worker has registered {key}"
