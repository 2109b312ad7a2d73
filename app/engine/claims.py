"""Claiming due runs while enforcing declared queue controls across all workers.

A worker's definitions fall into groups: one group of every workflow that declares neither
a global ``concurrency_limit`` nor a ``rate_limit`` (claimed by the single statement of
:func:`app.db.queries.runs.claim_runs`, the hot path), and one group per workflow that
declares one. A controlled workflow is claimed in its own transaction that first takes a
PostgreSQL transaction-scoped advisory lock on the workflow name, so that every worker
counts leases and spends rate budget one at a time (on SQLite ``BEGIN IMMEDIATE`` already
serializes writers). Groups take turns going first, so a deep backlog of one never starves
another. Priority orders runs within each claim (``ix_runs_claimable``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import RowMapping, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.database import Database, fetch_now
from app.db.queries import events as events_q
from app.db.queries import rate_limits as rate_q
from app.db.queries import runs as runs_q
from app.engine.registry import Registry
from app.sdk.queue import RateLimit

log = structlog.get_logger("treadle.claims")


@dataclass(frozen=True)
class ControlledWorkflow:
    """The claim rule of one workflow that declares a global limit or a rate limit.

    When the worker registered several versions that disagree, the strictest declaration
    applies: the smallest ``concurrency_limit`` and the slowest ``rate_limit``.
    """

    workflow: str
    keys: tuple[tuple[str, str], ...]
    concurrency_limit: int | None
    rate_limit: RateLimit | None

    @property
    def lock_id(self) -> int:
        """A stable signed 64-bit id for ``pg_advisory_xact_lock`` (BLAKE2b of the name)."""
        digest = hashlib.blake2b(f"treadle.queue:{self.workflow}".encode(), digest_size=8)
        return int.from_bytes(digest.digest(), "big", signed=True)


def rate_bucket(rate: RateLimit, tenant_id: str, concurrency_key: str | None) -> str:
    """The GCRA bucket of a run: ``""`` (whole workflow) or its tenant and key.

    Length-prefixed so that no (tenant, key) pair collides with another; at most
    3 + 1 + 128 + 1 + 255 characters (``rate_limit_buckets.bucket`` is 400).
    """
    if rate.by == "workflow":
        return ""
    return f"{len(tenant_id)}:{tenant_id}/{concurrency_key or ''}"


def gcra(rate: RateLimit, tat: datetime | None, now: datetime) -> tuple[bool, datetime]:
    """One GCRA decision (ITU-T I.371, the virtual-scheduling form).

    Args:
        rate: the declared limit (emission interval ``T = 1/per_second``, tolerance
            ``tau = (burst - 1) * T``).
        tat: the bucket's theoretical arrival time, or None for a new bucket.
        now: database time (UTC).

    Returns:
        ``(True, new_tat)`` when a start now conforms (store ``new_tat``), else
        ``(False, when)``: the earliest UTC time at which it will.
    """
    interval = timedelta(seconds=rate.interval_seconds)
    tolerance = interval * (rate.burst - 1)
    start = now if tat is None or tat < now else tat
    if start - now <= tolerance:
        return True, start + interval
    return False, start - tolerance


class Claimer:
    """Claims due runs of a worker's registered definitions, honouring queue controls.

    Args:
        db: the database.
        registry: the worker's definitions (their declared :class:`QueueControls`).
        worker_id: the lease owner written on claimed runs.
        lease_ttl: lease length in seconds.
    """

    def __init__(self, db: Database, registry: Registry, *, worker_id: str, lease_ttl: float):
        self.db = db
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl
        self.log = log.bind(worker_id=worker_id)
        controls = {(n, v): _queue(registry, n, v) for n, v in registry.keys}
        # Every version of a controlled workflow is claimed under its rule, including
        # versions that declare nothing, since the limit is on the workflow.
        names = {n for (n, _), q in controls.items() if q[0] is not None or q[1] is not None}
        self.plain_keys: tuple[tuple[str, str], ...] = tuple(
            k for k in registry.keys if k[0] not in names
        )
        self.controlled: tuple[ControlledWorkflow, ...] = tuple(
            _controlled(name, {k: q for k, q in controls.items() if k[0] == name})
            for name in sorted(names)
        )
        self._turn = 0

    async def claim(self, limit: int, executing: Collection[uuid.UUID] = ()) -> list[RowMapping]:
        """Lease up to ``limit`` due runs; each group in its own short write transaction.

        A group whose transaction fails (database down, lock timeout) is logged and skipped
        for this round; runs claimed by the other groups are still returned, so none is
        left leased but not executed. ``run_claimed`` events are written with the claim.

        Args:
            limit: at most this many runs.
            executing: runs this worker is still executing. They are never claimed
                again, even once their lease has expired (a worker paused past its lease
                resumes them itself, or loses them to another worker's claim, whose new
                fence stops the old execution at its next write).
        """
        running = tuple(executing)
        groups: list[ControlledWorkflow | None] = [None] if self.plain_keys else []
        groups += list(self.controlled)
        if not groups:
            return []
        self._turn = (self._turn + 1) % len(groups)
        claimed: list[RowMapping] = []
        for group in groups[self._turn :] + groups[: self._turn]:
            room = limit - len(claimed)
            if room <= 0:
                break
            try:
                if group is None and self.db.dialect == "postgresql":
                    # One statement (claim and its events), one round trip.
                    async with self.db.autocommit() as conn:
                        rows = await runs_q.claim_runs(
                            conn,
                            worker_id=self.worker_id,
                            definition_keys=self.plain_keys,
                            limit=room,
                            lease_ttl=self.lease_ttl,
                            with_events=True,
                            executing=running,
                        )
                else:
                    async with self.db.write() as conn:
                        if group is None:
                            rows = await runs_q.claim_runs(
                                conn,
                                worker_id=self.worker_id,
                                definition_keys=self.plain_keys,
                                limit=room,
                                lease_ttl=self.lease_ttl,
                                executing=running,
                            )
                        else:
                            rows = await self._claim_controlled(conn, group, room, running)
                        if rows:
                            await events_q.append_claims(conn, rows, worker_id=self.worker_id)
            except Exception as exc:  # noqa: BLE001 - DB down: the worker keeps polling
                self.log.warning(
                    "claim failed",
                    workflow=None if group is None else group.workflow,
                    error=str(exc)[:300],
                )
                continue
            claimed.extend(rows)
        return claimed

    async def _claim_controlled(
        self,
        conn: AsyncConnection,
        group: ControlledWorkflow,
        room: int,
        executing: Sequence[uuid.UUID],
    ) -> Sequence[RowMapping]:
        if conn.dialect.name == "postgresql":
            # Held to commit: every worker's count-then-claim of this workflow is serial.
            await conn.execute(select(func.pg_advisory_xact_lock(group.lock_id)))
        if group.concurrency_limit is not None:
            held = await runs_q.count_leased(conn, workflow=group.workflow)
            room = min(room, group.concurrency_limit - held)
            if room <= 0:
                return []
        if group.rate_limit is None:
            return await runs_q.claim_runs(
                conn,
                worker_id=self.worker_id,
                definition_keys=group.keys,
                limit=room,
                lease_ttl=self.lease_ttl,
                executing=executing,
            )
        return await self._claim_rate_limited(conn, group, group.rate_limit, room, executing)

    async def _claim_rate_limited(
        self,
        conn: AsyncConnection,
        group: ControlledWorkflow,
        rate: RateLimit,
        room: int,
        executing: Sequence[uuid.UUID],
    ) -> Sequence[RowMapping]:
        candidates = await runs_q.due_candidates(
            conn, definition_keys=group.keys, limit=room, executing=executing
        )
        if not candidates:
            return []
        now = await fetch_now(conn, conn.dialect.name)
        # Only a run's first start spends budget; resuming after a timer, an approval or a
        # retry back-off is the same run continuing.
        chosen: dict[Any, RowMapping] = {
            c["run_id"]: c for c in candidates if c["started_at"] is not None
        }
        fresh = [c for c in candidates if c["started_at"] is None]
        bucket_of = {
            c["run_id"]: rate_bucket(rate, c["tenant_id"], c["concurrency_key"]) for c in fresh
        }
        tats: dict[str, datetime | None] = dict.fromkeys(bucket_of.values())
        tats.update(await rate_q.load_tats(conn, workflow=group.workflow, bucket_ids=list(tats)))
        spent: dict[str, datetime] = {}
        deferred: dict[datetime, list[Any]] = {}
        for c in fresh:
            bucket = bucket_of[c["run_id"]]
            ok, when = gcra(rate, tats[bucket], now)
            if ok:
                tats[bucket] = spent[bucket] = when
                chosen[c["run_id"]] = c
            else:
                deferred.setdefault(when, []).append(c["run_id"])
        for until, run_ids in deferred.items():
            await runs_q.defer_runs(conn, run_ids=run_ids, until=until)
        await rate_q.store_tats(conn, workflow=group.workflow, tats=spent)
        return await runs_q.claim_listed_runs(
            conn, worker_id=self.worker_id, due=chosen, lease_ttl=self.lease_ttl, started_at=now
        )


def _queue(registry: Registry, name: str, version: str) -> tuple[int | None, RateLimit | None]:
    definition = registry.get(name, version)
    assert definition is not None  # the keys come from the registry itself
    return definition.queue.concurrency_limit, definition.queue.rate_limit


def _controlled(
    name: str, controls: dict[tuple[str, str], tuple[int | None, RateLimit | None]]
) -> ControlledWorkflow:
    limits = [limit for limit, _ in controls.values() if limit is not None]
    rates = [rate for _, rate in controls.values() if rate is not None]
    return ControlledWorkflow(
        workflow=name,
        keys=tuple(sorted(controls)),
        concurrency_limit=min(limits) if limits else None,
        rate_limit=min(rates, key=lambda r: r.per_second) if rates else None,
    )
