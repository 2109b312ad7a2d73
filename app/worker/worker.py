"""The worker process: claim loop, heartbeat, LISTEN wake-ups, graceful drain.

One composition root, :func:`run_worker`. A worker registers its definitions, then loops:
claim due runs (``FOR UPDATE SKIP LOCKED``), hand each to the engine in its own task
under a lease (:func:`app.engine.executor.execute_claim`, which also persists the
outcome through :class:`app.engine.journal.RunJournal`), renew all its leases with one
heartbeat statement, and on SIGTERM stop claiming, let in-flight runs finish within the
grace period and give the rest back at once. It writes no run state itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy import RowMapping
from sqlalchemy.engine import make_url

from app.core import json, metrics, tracing
from app.core.errors import CheckpointFault, LeaseLost
from app.core.settings import Settings
from app.core.tasks import cancel_and_wait
from app.db.database import Database
from app.db.faults import classify, wait_out_faults
from app.db.migrations import check_schema
from app.db.pooler import notifications_arrive, statement_timeout_mismatch
from app.db.queries import definitions as defs_q
from app.db.queries import runs as runs_q
from app.db.statistics import StatisticsKeeper
from app.engine import slots, story_log
from app.engine.batches import BatchRunner
from app.engine.claims import Claimer
from app.engine.executor import execute_claim
from app.engine.journal import RunJournal
from app.engine.outcomes import Completed, Failed
from app.engine.registry import Registry
from app.engine.schedules import Scheduler
from app.engine.submit import Submitter
from app.engine.wakeup import NOTIFY_CHANNEL
from app.worker.metrics_http import serve_metrics
from app.worker.webhooks import WebhookSender

log = structlog.get_logger("treadle.worker")

LISTEN_PROBE_SECONDS = 5.0
"""How long a worker waits for its start-up test notification (a direct LISTEN hears it
within milliseconds; app.db.pooler.notifications_arrive)."""
LISTEN_APPLICATION_NAME = "treadle-worker-listen"
"""``application_name`` of a worker's LISTEN connection (see pg_stat_activity)."""
LISTEN_CHECK_TIMEOUT_SECONDS = 5.0
"""Bound on the LISTEN connection's connect and on each liveness ``SELECT 1``: a server
that stops answering without closing the socket (frozen, partitioned away) is given up
on and reconnected instead of holding the LISTEN forever (asyncpg's default connect
timeout is 60 s, and a statement has none)."""
LISTEN_RETRY_SECONDS = (0.1, 2.0)
"""First and longest pause between reconnects of a lost LISTEN connection (doubling, never
longer than ``TREADLE_POLL_INTERVAL_SECONDS``). Not the poll interval itself: until LISTEN
is back the worker wakes only by polling, and a failover (docs/adr/0031) is over in
seconds while a poll interval may be a minute."""


@dataclass(eq=False)
class _Active:
    """One execution of one run under one claim (its fence).

    Compared by identity: the bookkeeping of an execution (heartbeat verdicts, the
    cleanup when it ends) must only ever touch its own entry, never a later execution
    of the same run.
    """

    fence: int
    task: asyncio.Task[None] = field(init=False)
    finalizing: bool = False
    lost: bool = False


@dataclass
class WorkerStats:
    """Counters for tests and logs (metrics arrive with the operations issue)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    suspended: int = 0
    lease_lost: int = 0
    released: int = 0
    db_faults: int = 0


class Worker:
    """Executes runs of the registered definitions.

    Args:
        settings: lease TTL, heartbeat, poll interval, concurrency, grace period.
        db: the database (shared with an in-process API in ``treadle dev``).
        registry: definitions this worker can run.
        concurrency: runs executed at once (default ``TREADLE_WORKER_CONCURRENCY``).
        worker_id: stable id for leases (default ``<host>:<pid>:<random>``).
    """

    def __init__(
        self,
        settings: Settings,
        db: Database,
        registry: Registry,
        *,
        concurrency: int | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.registry = registry
        self.concurrency = concurrency or settings.worker_concurrency
        self.worker_id = worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        )
        self.stats = WorkerStats()
        self.submitter = Submitter(db, settings)
        # Every worker also fires schedules; any number of them may (see engine.schedules).
        self.scheduler = Scheduler(
            db, settings, submitter=self.submitter, scheduler_id=self.worker_id, on_fire=self.wake
        )
        # Every worker also processes bulk-action batches (docs/adr/0023-durable-batches.md).
        self.batches = BatchRunner(db, settings, worker_id=self.worker_id)
        # Every worker also sends webhook deliveries (docs/adr/0030-outbound-webhooks.md).
        self.webhooks = WebhookSender(db, settings, worker_id=self.worker_id)
        self.claimer = Claimer(
            db, registry, worker_id=self.worker_id, lease_ttl=settings.lease_ttl_seconds
        )
        self._active: dict[uuid.UUID, _Active] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self.listening = asyncio.Event()
        """Set while this worker's LISTEN for submissions is up (PostgreSQL), cleared when
        that connection is lost; never set on SQLite, where polling is the only wake-up.
        Tests wait on it instead of guessing from ``pg_stat_activity``, whose ``query``
        column shows only a session's last statement (the liveness ``SELECT 1``)."""
        self._last_heartbeat_ok = time.monotonic()
        self.log = log.bind(worker_id=self.worker_id)

    @property
    def in_flight(self) -> int:
        """Runs this worker is executing right now (the test kit's idle check reads it)."""
        return len(self._active)

    def wake(self) -> None:
        """Ask the claim loop to look for work now (NOTIFY, a freed slot, in-process submit)."""
        self._wake.set()

    def stop(self) -> None:
        """Begin a graceful drain (what SIGTERM does)."""
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> asyncio.Event:
        """Set once :meth:`stop` was called; start-up waits (the schema check) end on it."""
        return self._stopping

    async def register(self) -> None:
        """Upsert definitions and this worker's row."""
        async with self.db.write() as conn:
            await self.registry.register(conn)
            await defs_q.upsert_worker(
                conn,
                worker_id=self.worker_id,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                concurrency=self.concurrency,
                definitions=json.dumps([f"{n}@{v}" for n, v in self.registry.keys]),
            )

    async def run(self, on_ready: Callable[[Worker], None] | None = None) -> None:
        """Register, then claim and execute until :meth:`stop`; then drain.

        ``on_ready(self)`` is called after registration, before the first claim. A
        registration meeting a database fault (the worker started during an outage, or
        PostgreSQL restarted just then) is retried until it succeeds, :meth:`stop`, or
        ``TREADLE_DB_START_TIMEOUT_SECONDS`` (then ``DatabaseUnreachableAtStart``;
        :func:`app.db.faults.wait_out_faults`); stopped first, this returns at once.
        """
        if not await wait_out_faults(
            self.register,
            what="register",
            stopping=self._stopping,
            give_up_after_seconds=self.settings.db_start_timeout_seconds,
        ):
            return
        self.log.info(
            "worker started", definitions=len(self.registry), concurrency=self.concurrency
        )
        if on_ready is not None:
            on_ready(self)
        helpers = [
            asyncio.create_task(self._heartbeat_loop()),
            asyncio.create_task(self._slot_sweep_loop()),
            asyncio.create_task(self.batches.run(self._stopping)),
            asyncio.create_task(self.webhooks.run(self._stopping)),
            asyncio.create_task(
                StatisticsKeeper(self.db, self.settings.analyze_interval_seconds).run(
                    self._stopping
                )
            ),
        ]
        listen = self.settings.listen_url
        if listen is not None:
            helpers.append(asyncio.create_task(self._listen_loop(listen)))
        elif self.db.dialect == "postgresql":
            # Behind a transaction pooler with no direct URL for LISTEN (docs/deployment.md).
            self.log.info(
                "not listening for wake-ups: TREADLE_DB_POOLER=transaction and no "
                "TREADLE_LISTEN_DATABASE_URL; polling",
                poll_interval_seconds=self.settings.poll_interval_seconds,
            )
        if self.settings.scheduler_enabled:
            helpers.append(asyncio.create_task(self.scheduler.run()))
        try:
            await self._claim_loop()
        finally:
            await self._drain()
            # Cancelled until they end: a helper can lose its first cancellation inside a
            # driver call (app/core/tasks.py), and the drain must still finish.
            await cancel_and_wait(helpers)
            with contextlib.suppress(Exception):
                async with self.db.write() as conn:
                    await defs_q.stop_worker(conn, self.worker_id)
            self.log.info("worker stopped", **vars(self.stats))

    # --- claiming --------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            free = self.concurrency - len(self._active)
            rows: list[RowMapping] = []
            self._wake.clear()
            if free > 0:
                # Never raises: a failing claim is logged and retried at the next poll.
                # Our own runs in flight are excluded: after a pause longer than the lease
                # they are due again, and claiming them would run them twice in here.
                sent = time.monotonic()  # bounds each run's clock estimate (RunExecution)
                rows = await self.claimer.claim(free, executing=list(self._active))
                if rows and self._stopping.is_set():
                    # The claim was under way when the drain began (SIGTERM): give these
                    # runs back at once instead of starting work the drain would then
                    # wait for, up to its grace, and interrupt.
                    for row in rows:
                        self.stats.claimed += 1
                        with structlog.contextvars.bound_contextvars(run_id=str(row["run_id"])):
                            await self._give_back(row)
                    break
                for row in rows:
                    self._start(row, sent)
                if len(rows) == free:
                    continue  # every free slot filled: more due work may be right behind
                # Fewer than asked: the claim took every due run it could see. Claiming
                # again at once would find none, and its round trip would hold up the runs
                # just started; a submit meanwhile NOTIFYs (``_wake``), polling covers a
                # lost one.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval_seconds)

    def _start(self, row: RowMapping, claim_sent: float) -> None:
        run_id: uuid.UUID = row["run_id"]
        self.stats.claimed += 1
        if row["due_at"] is not None:
            lag = (row["updated_at"] - row["due_at"]).total_seconds()
            metrics.SCHEDULE_TO_START.labels(row["workflow"]).observe(max(lag, 0.0))
        previous = self._active.get(run_id)
        if previous is not None:  # pragma: no cover - the claim excludes runs in flight
            # Defence in depth: the claim moved the fence, so the older execution can no
            # longer write; stop it rather than let two executions of one run overlap.
            self.log.error("claimed a run already in flight", run_id=str(run_id))
            self._lose(previous)
        active = _Active(fence=int(row["fence"]))
        # In a span of its own when tracing is on (app/core/tracing.py execution_span).
        execution = tracing.execution(self._execute(row, active, claim_sent), row, self.worker_id)
        active.task = asyncio.create_task(execution, name=f"run-{run_id}")
        self._active[run_id] = active
        self._update_slots()

    async def _execute(self, row: RowMapping, active: _Active, claim_sent: float) -> None:
        run_id: uuid.UUID = row["run_id"]
        rlog = self.log.bind(run_id=str(run_id), workflow=row["workflow"], tenant=row["tenant_id"])
        # This task's own context: every line of the execution (and of its steps) has them.
        story_log.bind_run(row, self.worker_id)
        try:
            definition = self.registry.get(row["workflow"], row["version"])
            if definition is None:  # pragma: no cover - the claim filters on registered keys
                return
            outcome = await execute_claim(
                self.db,
                self.settings,
                row,
                definition,
                self.worker_id,
                self.submitter,
                settling=lambda: setattr(active, "finalizing", True),
                claim_sent=claim_sent,
            )
            if isinstance(outcome, Completed):
                self.stats.completed += 1
            elif isinstance(outcome, Failed):
                self.stats.failed += 1
            else:
                self.stats.suspended += 1
                if outcome.delay is not None:
                    # Come back for our own timer when it is due rather than at the next poll.
                    asyncio.get_running_loop().call_later(max(outcome.delay, 0.0), self._wake.set)
        except LeaseLost as exc:
            self.stats.lease_lost += 1
            metrics.LEASE_LOSSES.inc()
            rlog.warning("lease lost; abandoning run")
            tracing.record_error(exc)
        except CheckpointFault as exc:
            tracing.record_error(exc)
            await self._fault(row, exc.fault, exc.__cause__, rlog)
        except asyncio.CancelledError:
            if active.lost:
                self.stats.lease_lost += 1
                metrics.LEASE_LOSSES.inc()
                rlog.warning("lease lost; execution stopped")
            # Fenced, so harmless if the lease is really gone; if we still hold it, the
            # run is claimable again at once instead of waiting for the lease to expire.
            await asyncio.shield(self._give_back(row))
        except Exception as exc:  # noqa: BLE001
            fault = classify(exc)
            if fault is not None:
                # Loading the journal or writing the outcome met the same faults.
                await self._fault(row, fault.value, exc, rlog)
            else:
                # An engine bug must not kill the worker; the lease expires and another
                # worker retries the run.
                rlog.exception("execution crashed")
            tracing.record_error(exc)
        finally:
            # Only our own entry: a later execution of this run must stay heartbeated.
            if self._active.get(run_id) is active:
                del self._active[run_id]
            self._update_slots()
            self._wake.set()

    async def _fault(
        self,
        row: RowMapping,
        fault: str,
        cause: BaseException | None,
        rlog: structlog.typing.FilteringBoundLogger,
    ) -> None:
        """Give back a run whose execution met a transient database fault.

        The fault is not the run's: nothing of the failed transaction was written, no
        attempt is counted, and the run is claimable again after a short pause (by this
        worker or another). If the release cannot be written either, the lease expires.
        """
        self.stats.db_faults += 1
        metrics.DB_FAULTS.labels(fault).inc()
        rlog.warning(
            "database fault; giving the run back",
            fault=fault,
            error=str(cause)[:300] if cause is not None else None,
        )
        await asyncio.shield(self._give_back(row, why=f"database {fault}", delay=1.0))

    async def _give_back(
        self, row: RowMapping, *, why: str = "worker draining", delay: float = 0.0
    ) -> None:
        # The release is the engine's (RunJournal.give_back, fenced on the claim's fence);
        # the worker only counts it.
        if await RunJournal(self.db, self.settings, row, self.worker_id).give_back(
            why=why, delay=delay
        ):
            self.stats.released += 1

    def _update_slots(self) -> None:
        metrics.WORKER_SLOTS.labels("busy").set(len(self._active))
        metrics.WORKER_SLOTS.labels("free").set(max(self.concurrency - len(self._active), 0))

    # --- leases ----------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_interval_seconds
        while True:
            await asyncio.sleep(interval)
            # Only runs we were executing before the statement started can be judged by
            # its result: a run claimed concurrently may be missing from it.
            before = dict(self._active)
            try:
                # The lease pool: no step's transaction can hold this connection, so a
                # worker whose main pool is taken by long transactional steps still
                # renews their leases (and its other runs' leases) on time.
                async with self.db.lease_write() as conn:
                    held = await runs_q.renew_leases(
                        conn,
                        worker_id=self.worker_id,
                        run_ids=list(before),
                        lease_ttl=self.settings.lease_ttl_seconds,
                    )
                    await defs_q.touch_worker(conn, self.worker_id)
            except Exception as exc:  # noqa: BLE001 - keep trying; leases may expire
                self.log.warning("heartbeat failed", error=str(exc)[:300])
                metrics.HEARTBEATS_FAILED.inc()
                if time.monotonic() - self._last_heartbeat_ok > self.settings.lease_ttl_seconds:
                    # Our leases have expired by now: stop work others may have taken.
                    for expired in list(self._active.values()):
                        self._lose(expired)
                continue
            self._last_heartbeat_ok = time.monotonic()
            for run_id, active in before.items():
                if self._active.get(run_id) is active and held.get(run_id) != active.fence:
                    self._lose(active)

    async def _slot_sweep_loop(self) -> None:
        """Once per lease TTL: admit runs left waiting behind a free concurrency slot.

        Every path that frees a slot admits the next waiter in its own transaction; this
        is the safety net (app/engine/slots.py ``sweep``), a read that finds nothing to do
        in normal operation.
        """
        while True:
            await asyncio.sleep(self.settings.lease_ttl_seconds)
            try:
                if await slots.sweep(self.db):
                    self._wake.set()
            except Exception as exc:  # noqa: BLE001 - DB down: try again next time
                self.log.warning("slot sweep failed", error=str(exc)[:300])

    def _lose(self, active: _Active) -> None:
        if active.finalizing or active.task.done():
            return
        active.lost = True
        active.task.cancel()

    async def _listen_loop(self, url: str) -> None:
        """LISTEN for submissions on PostgreSQL over ``url``; polling covers any gap.

        Its own connection, outside the pools: a LISTEN belongs to a session, so ``url``
        is a direct connection, never a transaction pooler (``Settings.listen_url``).
        """
        import asyncpg

        # The connect arguments the engine's own dialect derives from the URL: a multi-host
        # URL (``?host=a:5432&host=b:5432&target_session_attrs=read-write``, an HA cluster)
        # keeps every host and the attribute, so after a failover LISTEN lands on the new
        # primary. Re-rendering the URL as an asyncpg DSN kept only the last ``host``.
        _args, kwargs = self.db.engine.dialect.create_connect_args(make_url(url))
        kwargs.pop("prepared_statement_cache_size", None)
        # Named, so operators (and the HA test) can find the LISTEN sessions in
        # pg_stat_activity on whichever node is the primary.
        kwargs["server_settings"] = {"application_name": LISTEN_APPLICATION_NAME}
        kwargs["timeout"] = LISTEN_CHECK_TIMEOUT_SECONDS
        probed = False
        pause = LISTEN_RETRY_SECONDS[0]
        lost_at: float | None = None  # monotonic time the connection was lost, while it is
        while True:
            conn: Any = None
            try:
                conn = await asyncpg.connect(**kwargs)
                # asyncpg's LISTEN (and the probe's UNLISTEN) take no timeout of their own.
                async with asyncio.timeout(LISTEN_CHECK_TIMEOUT_SECONDS):
                    await conn.add_listener(NOTIFY_CHANNEL, lambda *_: self._wake.set())
                self._wake.set()  # catch anything submitted while we were not listening
                self.listening.set()
                pause = LISTEN_RETRY_SECONDS[0]
                if lost_at is not None:
                    self.log.info(
                        "listen connection re-established",
                        after_seconds=round(time.monotonic() - lost_at, 3),
                    )
                    lost_at = None
                if not probed:
                    async with asyncio.timeout(LISTEN_PROBE_SECONDS + LISTEN_CHECK_TIMEOUT_SECONDS):
                        await self._probe_listen(conn)
                    probed = True  # once per process, unless the probe met a fault
                while not conn.is_closed():
                    await asyncio.sleep(self.settings.heartbeat_interval_seconds)
                    await conn.execute("SELECT 1", timeout=LISTEN_CHECK_TIMEOUT_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect after a pause
                if lost_at is None:  # one line per outage, not one per attempt
                    lost_at = time.monotonic()
                    self.log.warning("listen connection lost", error=str(exc)[:300])
                await asyncio.sleep(min(pause, self.settings.poll_interval_seconds))
                pause = min(pause * 2, LISTEN_RETRY_SECONDS[1])
            finally:
                self.listening.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=LISTEN_CHECK_TIMEOUT_SECONDS)
                    if not conn.is_closed():
                        conn.terminate()  # a frozen server never answers the goodbye

    async def _probe_listen(self, conn: Any) -> None:
        """Once per process: say so, as an error, if the LISTEN hears no NOTIFY.

        A LISTEN URL that is a transaction pooler (or another server or database) is
        accepted and hears nothing (:func:`app.db.pooler.notifications_arrive`): the
        worker still works, by polling, but a wake-up the operator configured is gone.
        """
        if await notifications_arrive(conn, self.db, LISTEN_PROBE_SECONDS):
            return
        self.log.error(
            "the LISTEN connection (TREADLE_LISTEN_DATABASE_URL, or TREADLE_DATABASE_URL) "
            f"heard no test notification within {LISTEN_PROBE_SECONDS:g} s: it must be a "
            "direct session on the primary of TREADLE_DATABASE_URL, not a transaction "
            'pooler (docs/deployment.md, "Behind PgBouncer"); this worker wakes by '
            "polling only",
            poll_interval_seconds=self.settings.poll_interval_seconds,
        )

    # --- shutdown --------------------------------------------------------------------

    async def _drain(self) -> None:
        if not self._active:
            return
        grace = self.settings.drain_grace_seconds
        self.log.info("draining", in_flight=len(self._active), grace_seconds=grace)
        tasks = [a.task for a in self._active.values()]
        _done, pending = (
            await asyncio.wait(tasks, timeout=grace) if grace > 0 else (set(), set(tasks))
        )
        for task in pending:
            task.cancel()  # each cancelled execution releases its own lease
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def _check_database(db: Database) -> None:
    """Check the schema revision; behind a pooler, warn about a differing statement timeout.

    Raises:
        Whatever :func:`check_schema` raises (not migrated, wrong revision, a fault); the
        role's ``statement_timeout`` differing from the setting is only logged
        (docs/deployment.md, "Behind PgBouncer").
    """
    await check_schema(db)
    mismatch = await statement_timeout_mismatch(db)
    if mismatch is not None:
        log.warning(mismatch)


async def run_worker(
    settings: Settings,
    handler_modules: list[str],
    concurrency: int | None = None,
    metrics_port: int | None = None,
    on_ready: Callable[[Worker], None] | None = None,
) -> None:
    """Composition root of ``treadle worker``: build everything, run until SIGTERM/SIGINT.

    ``on_ready`` is called once the worker has registered its definitions and is about
    to claim (``treadle worker`` prints its ready line there).

    Raises:
        SchemaVersionMismatch: the database is not migrated to this code's head.
        DatabaseUnreachableAtStart: the database stayed unreachable for
            ``TREADLE_DB_START_TIMEOUT_SECONDS`` (each attempt logged a warning).
        HandlersNotLoaded: a handler module is missing, fails to import or defines no
            workflow.
    """
    registry = Registry.from_modules(handler_modules)
    # No pre-ping round trip per checkout (two per plain step): after a server restart the
    # first statement on a dead pooled connection fails before reaching the server, is
    # classified as database_unavailable, and the run is given back or the claim retried.
    db = Database(settings, pre_ping=False)
    try:
        worker = Worker(settings, db, registry, concurrency=concurrency)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        # Started during a database outage (or one beginning now), the worker waits for
        # the database rather than exiting; a schema at the wrong revision still exits.
        if not await wait_out_faults(
            lambda: _check_database(db),
            what="schema check",
            stopping=worker.stopping,
            give_up_after_seconds=settings.db_start_timeout_seconds,
        ):
            return
        if metrics_port is not None:
            # A server thread of prometheus_client's app: /metrics of this worker process,
            # HEAD included (app.worker.metrics_http).
            serve_metrics(metrics_port, settings.host)
        await worker.run(on_ready=on_ready)
    finally:
        await db.dispose()
