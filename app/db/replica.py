"""The read replica: when a read that may lag is served by it, and when by the primary.

``TREADLE_READ_DATABASE_URL`` names a PostgreSQL streaming replica (a hot standby) of the
primary. Only :meth:`app.db.database.Database.lagging_read` ever uses it, and only reads
whose answer may trail the primary by ``TREADLE_READ_MAX_LAG_SECONDS`` go through that
(the list in docs/deployment.md, "Read replica"; the rule in
docs/adr/0033-lag-tolerant-reads-on-a-replica.md).

How far behind the replica is comes from a heartbeat
(docs/adr/0049-replica-lag-from-a-heartbeat.md): :class:`ReplicaHeartbeat`, run by each
API process that has a replica, moves the one row of ``replica_heartbeat`` to the
primary's ``now()`` every :func:`heartbeat_interval` seconds; on the replica the age of
that row by the replica's clock is the lag. It grows whatever keeps the replica from
having the primary's latest commits (replay paused or slow, the WAL receiver cut off from
the primary or stalled, the primary gone), and stays below the interval on a standby that
streams, however idle the primary is. Replay positions alone cannot tell those apart: a
standby cut off from an idle primary has replayed all it received, as a healthy one has.

:class:`ReplicaGate` decides per checkout whether the replica serves the read:

* **unreachable** (connection refused, reset, timed out: :func:`app.db.faults.classify`
  says ``unavailable``; or any error opening a connection, e.g. a database that does
  not exist there or a role it refuses, which no retry of the request would fix): the
  read goes to the primary, and so does every lagging read for
  the next :data:`RECHECK_SECONDS`, so an outage costs one failed connect per interval
  rather than one per request;
* **too far behind**: its lag (the heartbeat's age) is measured on the checked-out
  connection at most once per :data:`RECHECK_SECONDS`; past the bound, or when it cannot
  be told (no heartbeat has reached the replica yet), the read goes to the primary for
  that interval.

Either way ``treadle_db_replica_fallbacks_total{reason}`` counts each read the primary
served instead, and one warning is logged when the replica stops being used (one info
line when it is used again), not one per read; the warning names the lag and the WAL
receiver's state where the role may see it (``pg_stat_wal_receiver.status``, e.g. none
while it cannot reach the primary). ``treadle_db_replica_up`` is 1 while the
replica serves, 0 while it does not, and ``treadle_db_replica_lag_seconds`` is NaN while
it cannot be reached (no lag was measured, and the last one would look healthy).
``treadle_db_replica_in_recovery`` is 0 when the server the URL names is a primary (a
failover promoted the standby): it still serves, correctly and never behind, but offloads
nothing, which a warning says once and the gauge shows until it is a standby again. A full
replica pool is *not* a reason to fall back: that is load, which the replica exists to
keep off the primary; it answers 503 ``database_busy`` as a full main pool does.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy.exc
import structlog
from sqlalchemy import Float, bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core import metrics
from app.db.faults import DbFault, classify, describe

if TYPE_CHECKING:
    from app.db.database import Database  # imports this module

log = structlog.get_logger("treadle.db")

RECHECK_SECONDS = 1.0
"""How long a lag measurement, or a verdict that the replica is not usable, holds."""

CONNECT_TIMEOUT_SECONDS = 5.0
"""asyncpg's connect timeout on the replica (its default is 60 s): a replica host that
does not answer delays at most one read per :data:`RECHECK_SECONDS` by this much. Its
statements also get asyncpg's ``command_timeout``: ``TREADLE_DB_STATEMENT_TIMEOUT_SECONDS``
plus this, so a server that stops answering mid-read (the server's own timeout cannot
fire then) fails the read instead of holding the request forever."""

HEARTBEAT_SECONDS = 1.0
"""The longest interval between two heartbeats (see :func:`heartbeat_interval`)."""

HEARTBEAT_MIN_SECONDS = 0.1
"""The shortest: a smaller ``TREADLE_READ_MAX_LAG_SECONDS`` would mean a write per few ms."""


def heartbeat_interval(max_lag_seconds: float) -> float:
    """Seconds between two heartbeats for a lag bound of ``max_lag_seconds``.

    A standby that streams shows a heartbeat up to one interval old (plus the replication
    delay, milliseconds), so the interval stays well inside the bound: half of it, at most
    :data:`HEARTBEAT_SECONDS` (one small write a second), at least
    :data:`HEARTBEAT_MIN_SECONDS` (a bound under twice that cannot be kept by an idle
    standby, which then counts as lagging between beats).
    """
    return max(min(HEARTBEAT_SECONDS, max_lag_seconds / 2), HEARTBEAT_MIN_SECONDS)


# One statement, cheap whoever runs it: the row moves to now() only if it is older than
# :fresh seconds (or missing), so any number of API processes beating every interval make
# about one write per interval between them (the others' statement finds a fresh row and
# writes nothing). Never backwards: of two beats racing, the later now() stays.
_BEAT = text(
    """
    INSERT INTO replica_heartbeat (id, beat_at)
    SELECT 1, now()
    WHERE NOT EXISTS (
        SELECT FROM replica_heartbeat WHERE beat_at > now() - make_interval(secs => :fresh)
    )
    ON CONFLICT (id) DO UPDATE SET beat_at = excluded.beat_at
    WHERE replica_heartbeat.beat_at < excluded.beat_at
    """
).bindparams(bindparam("fresh", type_=Float))

# The heartbeat is a marker, not data anyone waits for: its commit must not wait for a
# synchronous standby (one that is cut off would hold it, and the loop, indefinitely), and
# is flushed at once rather than up to wal_writer_delay later (synchronous_commit = off).
_LOCAL_COMMIT = text("SET LOCAL synchronous_commit TO local")

# Whether the server is a standby (a server not in recovery, the URL naming a primary or
# a promoted replica, is never behind), and its WAL receiver's state, for the log only:
# without pg_read_all_stats a role sees NULL for it, and "streaming" is no proof of
# freshness (a partitioned link stays "streaming" until wal_receiver_timeout, a minute by
# default; a receiver streams while replay is paused).
_ROLE_SQL = text("SELECT pg_is_in_recovery(), (SELECT status FROM pg_stat_wal_receiver)")

# On a standby, seconds its data may trail the primary: the age, by the standby's clock,
# of the newest heartbeat it has applied (written by the primary's clock: skewed clocks
# skew it, as they skew every lag PostgreSQL reports). No row: no heartbeat reached it.
# A statement of its own so that the role query above needs no Treadle table.
_AGE_SQL = text(
    "SELECT EXTRACT(EPOCH FROM clock_timestamp() - beat_at) FROM replica_heartbeat WHERE id = 1"
)

_UNDEFINED_TABLE = "42P01"


def _unavailable(exc: BaseException) -> bool:
    """True if ``exc`` means the replica cannot serve: a fault, or no answer in time.

    asyncpg raises a bare :class:`TimeoutError` when a connect outlasts its ``timeout``
    (:data:`CONNECT_TIMEOUT_SECONDS`) or a statement its ``command_timeout`` (a replica
    host that stopped answering: frozen, partitioned away). Only the replica's engine
    gets those timeouts, so here that error is the replica's, never a step's own.
    """
    return isinstance(exc, TimeoutError) or classify(exc) is DbFault.UNAVAILABLE


@dataclass(frozen=True)
class ReplicaStatus:
    """What one measurement on the replica found.

    Attributes:
        in_recovery: the server is a standby (False: a primary, e.g. promoted).
        lag_seconds: how many seconds the replica's data may trail the primary's (the
            heartbeat's age; 0.0 on a server that is not a standby); None when it cannot
            be told (no heartbeat has reached the replica).
        wal_receiver: ``pg_stat_wal_receiver.status`` (``streaming``, ``starting``,
            ``waiting``, ``stopping``…); None while no WAL receiver runs (it cannot reach
            its primary, or the standby restores from an archive) or when the role may
            not see it (it needs ``pg_read_all_stats``). For the log only.
    """

    in_recovery: bool
    lag_seconds: float | None
    wal_receiver: str | None


async def replica_status(conn: AsyncConnection) -> ReplicaStatus:
    """Whether the server behind ``conn`` is a standby, and how many seconds it trails.

    The lag is the age of the newest ``replica_heartbeat`` row the server has applied
    (:class:`ReplicaHeartbeat` writes it on the primary), clamped at 0 (clock skew); on a
    standby without that table (the URL names another database, or a schema older than
    revision 0028) it cannot be told. One round trip on a server that is not a standby,
    two on one. Ends the transaction it began, so the caller can ``begin()`` its own.
    """
    lag: float | None = 0.0
    try:
        in_recovery, receiver = (await conn.execute(_ROLE_SQL)).one()
        if in_recovery:
            try:
                age = (await conn.execute(_AGE_SQL)).scalar_one_or_none()
            except sqlalchemy.exc.ProgrammingError as exc:
                if getattr(exc.orig, "sqlstate", None) != _UNDEFINED_TABLE:
                    raise
                age = None
            lag = None if age is None else max(float(age), 0.0)
    finally:
        await conn.rollback()
    return ReplicaStatus(
        in_recovery=bool(in_recovery),
        lag_seconds=lag,
        wal_receiver=None if receiver is None else str(receiver),
    )


async def beat(conn: AsyncConnection, *, interval_seconds: float) -> bool:
    """Move the primary's heartbeat to its ``now()`` unless a beat this interval did.

    Args:
        conn: a connection to the primary, in a transaction the caller commits.
        interval_seconds: :func:`heartbeat_interval`; a row younger than half of it is
            left alone (another process beat), so processes out of step never let it
            age much past one interval.

    Returns:
        True if this call wrote the row.
    """
    await conn.execute(_LOCAL_COMMIT)
    result = await conn.execute(_BEAT, {"fresh": interval_seconds / 2})
    return bool(result.rowcount)


class ReplicaHeartbeat:
    """Calls :func:`beat` on the primary every interval until stopped.

    Run by each API process with ``TREADLE_READ_DATABASE_URL`` set (the process that reads
    the replica keeps the heartbeat its lag is measured by; ``app.api.app``); a
    :class:`ReplicaGate` with no heartbeat writer anywhere sees the row age and sends its
    reads to the primary, which fails safe.

    Args:
        db: the database (its primary; PostgreSQL: on SQLite :meth:`run` returns at once).
        interval_seconds: :func:`heartbeat_interval` of ``TREADLE_READ_MAX_LAG_SECONDS``.

    Attributes:
        written: how many beats this writer wrote (tests).
    """

    def __init__(self, db: Database, interval_seconds: float) -> None:
        self._db = db
        self._interval = interval_seconds
        self._failing = False  # for logging changes only
        self.written = 0

    async def beat_once(self) -> bool:
        """One beat; never raises.

        Returns:
            False when it failed (the primary unreachable, a statement timeout): logged
            once per change, not once per interval, and tried again at the next one.
        """
        try:
            async with self._db.write() as conn:
                wrote = await beat(conn, interval_seconds=self._interval)
        except Exception as exc:  # noqa: BLE001 - primary down or slow: try again next time
            if not self._failing:
                self._failing = True
                log.warning(
                    "read replica heartbeat not written: the replica's lag cannot be told "
                    "and will read as growing",
                    error=describe(exc),
                )
            return False
        if self._failing:
            self._failing = False
            log.info("read replica heartbeat written again")
        self.written += int(wrote)
        return True

    async def run(self, stopping: asyncio.Event) -> None:
        """Beat, then wait the interval (or until ``stopping``), until ``stopping`` is set."""
        if self._db.dialect != "postgresql":
            return
        while not stopping.is_set():
            await self.beat_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._interval)


class ReplicaGate:
    """Whether the replica serves the next read that may lag (see the module docstring).

    Args:
        engine: the replica pool's engine.
        max_lag_seconds: ``TREADLE_READ_MAX_LAG_SECONDS``.
        clock: monotonic seconds (tests may pass their own).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        max_lag_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.max_lag_seconds = max_lag_seconds
        self._clock = clock
        self._skip_until = float("-inf")  # the replica is not used before this time
        self._checked_until = float("-inf")  # its lag was fine when measured, until then
        self._skip_reason = ""
        self._usable = True  # for logging changes only
        self._standby = True  # likewise: the URL's server was in recovery when last seen

    async def connect(self) -> AsyncConnection | None:
        """A replica connection fit for a read that may lag, or None: read the primary.

        Returns:
            A connection (no transaction begun) the caller must close; None when the
            replica is unreachable or too far behind (counted in
            ``treadle_db_replica_fallbacks_total``).

        Raises:
            sqlalchemy.exc.TimeoutError: the replica pool stayed full for
                ``TREADLE_DB_POOL_TIMEOUT_SECONDS`` (not a fallback, see above).
            Anything else the replica raised that is not an ``unavailable`` fault.
        """
        now = self._clock()
        if now < self._skip_until:
            metrics.DB_REPLICA_FALLBACKS.labels(self._skip_reason).inc()
            return None
        try:
            conn = await self.engine.connect()
        except sqlalchemy.exc.TimeoutError:
            raise  # the replica pool is full: load, not a reason to move reads
        except Exception as exc:  # noqa: BLE001 - every connect failure moves the read
            # Any other failure to connect is the replica's, whatever its class: a
            # database that does not exist there (3D000), a role or pg_hba.conf refusing
            # us (28xxx): nothing of the request has run, and the primary can serve it.
            self._skip(now, "unavailable", error=describe(exc))
            return None
        if now < self._checked_until:
            return conn
        # Claimed before the round trip: reads arriving meanwhile do not measure too.
        self._checked_until = now + RECHECK_SECONDS
        try:
            status = await replica_status(conn)
        except Exception as exc:
            await conn.close()
            self._checked_until = float("-inf")
            if not _unavailable(exc):
                raise
            self._skip(now, "unavailable", error=describe(exc))
            return None
        lag = status.lag_seconds
        metrics.DB_REPLICA_LAG.set(-1.0 if lag is None else lag)
        self._note_role(status.in_recovery)
        if lag is None or lag > self.max_lag_seconds:
            await conn.close()
            self._checked_until = float("-inf")
            self._skip(
                now,
                "lagging",
                lag_seconds=None if lag is None else round(lag, 3),
                wal_receiver=status.wal_receiver,
            )
            return None
        metrics.DB_REPLICA_UP.set(1)
        if not self._usable:
            self._usable = True
            log.info("read replica in use again", lag_seconds=round(lag, 3))
        return conn

    def _note_role(self, in_recovery: bool) -> None:
        # A primary behind the read URL serves correct reads (never behind), so it is
        # used; but it offloads nothing, which the operator must hear of once.
        metrics.DB_REPLICA_IN_RECOVERY.set(1 if in_recovery else 0)
        if in_recovery == self._standby:
            return
        self._standby = in_recovery
        if in_recovery:
            log.info("read replica is a standby again: reads that may lag are offloaded")
        else:
            log.warning(
                "read replica is a primary (promoted by a failover, or the URL names one): "
                "reads that may lag are served but offload nothing; point "
                "TREADLE_READ_DATABASE_URL at a standby"
            )

    def _skip(self, now: float, reason: str, **detail: object) -> None:
        self._skip_until = now + RECHECK_SECONDS
        self._skip_reason = reason
        metrics.DB_REPLICA_FALLBACKS.labels(reason).inc()
        metrics.DB_REPLICA_UP.set(0)
        if reason == "unavailable":
            # No lag was measured: the last one shown would claim a healthy replica.
            metrics.DB_REPLICA_LAG.set(math.nan)
        if self._usable:
            self._usable = False
            log.warning(
                "read replica not used: reads that may lag go to the primary",
                reason=reason,
                max_lag_seconds=self.max_lag_seconds,
                **detail,
            )
