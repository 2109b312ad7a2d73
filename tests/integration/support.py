"""Helpers shared by the engine integration tests: in-process workers, submit, wait."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from sqlalchemy import RowMapping, event, select

from app.api.app import create_app
from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.worker.worker import Worker
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for


@contextlib.asynccontextmanager
async def workers(
    settings: Settings, db: Database, registry: Registry, *, count: int = 1, concurrency: int = 8
) -> AsyncIterator[list[Worker]]:
    """Run ``count`` in-process workers; drain and stop them on exit (30 s deadline)."""
    started = [Worker(settings, db, registry, concurrency=concurrency) for _ in range(count)]
    tasks = [asyncio.create_task(w.run()) for w in started]
    try:
        yield started
    finally:
        for w in started:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)


async def submit(
    db: Database,
    settings: Settings,
    registry: Registry,
    tenant_id: str,
    workflow: str,
    *,
    subject: str = "s",
    **inp: Any,
) -> uuid.UUID:
    """Register the registry's definitions, then submit one run; returns its id."""
    async with db.write() as conn:
        await registry.register(conn)
    row, _ = await Submitter(db, settings).submit(
        SubmitRequest(workflow=workflow, input=inp), tenant_id=tenant_id, subject=subject
    )
    run_id: uuid.UUID = row["run_id"]
    return run_id


async def reach(
    db: Database, tenant_id: str, run_id: uuid.UUID, *statuses: str, timeout: float = 30
) -> RowMapping:
    """Poll until the run is in one of ``statuses``; returns the row."""

    async def probe() -> RowMapping | None:
        async with db.read() as conn:
            row = await runs_q.get_run(conn, tenant_id, run_id)
        return row if row["status"] in statuses else None

    return await wait_for(probe, timeout=timeout, what=f"run {run_id} in {statuses}")


async def start_recorded(db: Database, run_id: uuid.UUID, timeout: float = 30) -> None:
    """Poll until the run has a step journaled ``running`` (its start record written).

    A plain step's start record is held while the attempt is younger than
    ``TREADLE_STEP_START_RECORD_AFTER_SECONDS`` (docs/adr/0040-one-commit-per-step.md);
    a test that acts on the step's row (locks it, expects a cancel to mark it) waits for it.
    """
    from app.db.tables import steps

    async def probe() -> bool:
        async with db.read() as conn:
            found = await conn.execute(
                select(steps.c.step_id).where(steps.c.run_id == run_id, steps.c.status == "running")
            )
            return found.first() is not None

    await wait_for(probe, timeout=timeout, what=f"run {run_id}: a step's start record")


@contextlib.asynccontextmanager
async def api_client(
    settings: Settings, db: Database, tenant: str, *, subject: str = "t"
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on an in-process API app (real routes, real database, no socket)."""
    app = create_app(settings, db=db, check_schema_on_start=False)
    tok = DevTokens(DEV_SECRET).mint(tenant_id=tenant, subject=subject, scopes=ALL_SCOPES)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://test",
        headers={"Authorization": f"Bearer {tok}"},
    ) as client:
        yield client


def record_statements(
    db: Database, names: re.Pattern[str], into: list[tuple[str, Any]]
) -> Callable[[], None]:
    """Record ``(statement, parameters)`` of the statements ``db`` sends that ``names`` matches.

    EXPLAINs are left out. Returns the function that stops recording.
    """

    def hook(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        if names.search(statement) and not statement.lstrip().upper().startswith("EXPLAIN"):
            into.append((statement, parameters))

    event.listen(db.engine.sync_engine, "before_cursor_execute", hook)
    return lambda: event.remove(db.engine.sync_engine, "before_cursor_execute", hook)
