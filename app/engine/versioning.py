"""Versioning: open runs per definition version, blocked runs, and migrating a run.

A run is pinned to the definition version it was submitted with, and a worker only claims
versions it registered (DESIGN §1). When no live worker has registered a run's version,
the run is *blocked*: ``GET /runs/{id}`` says so in ``blocked_reason`` and the
``treadle_runs_blocked`` gauge counts it. An operator can then re-pin it to a newer
registered version with :func:`migrate_run` (rules in docs/operations.md, "Versioning").
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import RowMapping, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.errors import InvalidState, RunFinished, WorkflowNotFound
from app.core.settings import Settings
from app.core.status import TERMINAL_RUN_STATUSES, EventKind, RunStatus
from app.db.database import Database, fetch_now
from app.db.queries import definitions as defs_q
from app.db.queries import events as events_q
from app.db.queries import runs as runs_q
from app.db.tables import runs
from app.engine.submit import SubmitRequest, Submitter, _version_order
from app.engine.wakeup import notify


@dataclass(frozen=True, slots=True)
class BlockedRun:
    """An open run a worker must pick up, of a version no live worker registered."""

    run_id: uuid.UUID
    workflow: str
    version: str
    status: str
    reason: str


async def live_keys(conn: AsyncConnection, settings: Settings) -> set[str]:
    """``name@version`` of every definition a live worker registered (2 lease TTLs)."""
    keys: set[str] = set()
    for worker in await defs_q.live_workers(conn, within_seconds=2 * settings.lease_ttl_seconds):
        keys.update(json.loads(worker["definitions"]))
    return keys


async def open_runs_by_version(db: Database, *, tenant_id: str) -> dict[tuple[str, str], int]:
    """The tenant's open (non-terminal) runs per ``(workflow, version)``."""
    async with db.read() as conn:
        return await runs_q.count_open_by_version(conn, tenant_id=tenant_id)


async def blocked_counts(conn: AsyncConnection, settings: Settings) -> dict[str, int]:
    """Blocked runs per workflow across tenants (for the ``treadle_runs_blocked`` gauge)."""
    live = await live_keys(conn, settings)
    counts = await runs_q.count_open_by_version(conn, tenant_id=None, claimable_only=True)
    out: dict[str, int] = {}
    for (workflow, version), n in counts.items():
        if f"{workflow}@{version}" not in live:
            out[workflow] = out.get(workflow, 0) + n
    return out


async def blocked_runs(
    db: Database, settings: Settings, *, tenant_id: str, limit: int = 1000
) -> list[BlockedRun]:
    """The tenant's runs that need a worker of a version no live worker registered."""
    async with db.read() as conn:
        live = await live_keys(conn, settings)
        rows: Sequence[Any] = (
            await conn.execute(
                select(runs.c.run_id, runs.c.workflow, runs.c.version, runs.c.status)
                .where(
                    runs.c.tenant_id == tenant_id,
                    runs.c.status.not_in([s.value for s in TERMINAL_RUN_STATUSES]),
                    runs.c.available_at.is_not(None),
                )
                .order_by(runs.c.run_id)
                .limit(limit)
            )
        ).all()
    return [
        BlockedRun(
            r.run_id, r.workflow, r.version, r.status, f"no live worker has registered {key}"
        )
        for r in rows
        if (key := f"{r.workflow}@{r.version}") not in live
    ]


def _require_open(run: RowMapping) -> None:
    if RunStatus(run["status"]).is_terminal:
        raise RunFinished(
            f"run {run['run_id']} already finished with status {run['status']!r}",
            run_id=str(run["run_id"]),
            run_status=run["status"],
        )


async def migrate_run(
    db: Database,
    settings: Settings,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    version: str,
    actor: str,
    reason: str | None = None,
) -> RowMapping:
    """Re-pin an open run to a newer registered version of its workflow.

    Rules: the run is not terminal and no worker holds a live lease on it; the target is
    a registered version of the same workflow, newer than the run's (numeric versions
    compare as numbers, others by first registration); the run's input is valid for the
    target's input schema. The journal is kept: the new code must replay it, guarding
    changes with ``ctx.patched`` (a run whose replay diverges fails with
    ``failure_nondeterminism``). The fence advances and a ``run_migrated`` event records
    who moved it from which version.

    Raises:
        RunNotFound: not this tenant's run (404).
        RunFinished: the run is terminal (409).
        InvalidState: a worker is executing it, or the target is not newer (409).
        WorkflowNotFound: the target version is not registered (404).
        InvalidInput: the input is not valid for the target version (422).
    """
    async with db.read() as conn:
        current = await runs_q.get_run(conn, tenant_id, run_id)
        definitions = await defs_q.get_definitions(conn, current["workflow"])
    _require_open(current)
    by_version = {d["version"]: d for d in definitions}
    target = by_version.get(version)
    if target is None:
        raise WorkflowNotFound(
            f"workflow {current['workflow']!r} has no registered version {version!r}",
            workflow=current["workflow"],
            version=version,
            registered_versions=sorted(by_version),
        )
    source = by_version.get(current["version"])
    if source is not None and _version_order(target) <= _version_order(source):
        raise InvalidState(
            f"can only migrate to a newer version than {current['version']!r}",
            run_id=str(run_id),
            version=current["version"],
        )
    # The input must be valid for the target (422 with field paths otherwise).
    await Submitter(db, settings).prepare(
        SubmitRequest(
            workflow=current["workflow"], input=json.loads(current["input"]), version=version
        )
    )

    async def migrate_tx(conn: AsyncConnection) -> RowMapping:
        run = await runs_q.lock_run(conn, tenant_id, run_id)
        _require_open(run)
        status = RunStatus(run["status"])
        now = await fetch_now(conn, db.dialect)
        leased = run["lease_expires_at"] is not None and run["lease_expires_at"] > now
        if leased and status in (RunStatus.RUNNING, RunStatus.CANCELLING, RunStatus.COMPENSATING):
            raise InvalidState(
                "a worker is executing this run; migrate it once it waits or is blocked",
                run_id=str(run_id),
            )
        if run["version"] != current["version"]:
            raise InvalidState("the run was migrated concurrently; retry", run_id=str(run_id))
        row = await runs_q.set_version(conn, run_id=run_id, version=version)
        await events_q.append(
            conn,
            run_id=run_id,
            tenant_id=tenant_id,
            kind=EventKind.RUN_MIGRATED,
            actor=actor,
            data={"from_version": current["version"], "to_version": version, "reason": reason},
        )
        await notify(conn)
        return row

    return await db.write_retrying(migrate_tx, what="migrate run")
