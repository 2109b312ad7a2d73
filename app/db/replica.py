"""The read replica: when a read that may lag is served by it, and when by the primary.

``TREADLE_READ_DATABASE_URL`` names a PostgreSQL streaming replica (a hot standby) of the
primary. Only :meth:`app.db.database.Database.lagging_read` ever uses it, and only reads
whose answer may trail the primary by ``TREADLE_READ_MAX_LAG_SECONDS`` go through that
(the list in docs/deployment.md, "Read replica"; the rule in
docs/adr/0033-lag-tolerant-reads-on-a-replica.md).

:class:`ReplicaGate` decides per checkout whether the replica serves the read:

* **unreachable** (connection refused, reset, timed out: :func:`app.db.faults.classify`
  says ``unavailable``; or any error opening a connection, e.g. a database that does
  not exist there or a role it refuses, which no retry of the request would fix): the
  read goes to the primary, and so does every lagging read for
  the next :data:`RECHECK_SECONDS`, so an outage costs one failed connect per interval
  rather than one per request;
* **too far behind**: its replay lag is measured on the checked-out connection at most
  once per :data:`RECHECK_SECONDS`; past the bound, or when it cannot be told (WAL
  received and not replayed, but no transaction replayed since the standby started),
  the read goes to the primary for that interval.

Either way ``treadle_db_replica_fallbacks_total{reason}`` counts each read the primary
served instead, and one warning is logged when the replica stops being used (one info
line when it is used again), not one per read. ``treadle_db_replica_up`` is 1 while the
replica serves, 0 while it does not, and ``treadle_db_replica_lag_seconds`` is NaN while
it cannot be reached (no lag was measured, and the last one would look healthy).
``treadle_db_replica_in_recovery`` is 0 when the server the URL names is a primary (a
failover promoted the standby): it still serves, correctly and never behind, but offloads
nothing, which a warning says once and the gauge shows until it is a standby again. A full
replica pool is *not* a reason to fall back: that is load, which the replica exists to
keep off the primary; it answers 503 ``database_busy`` as a full main pool does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import sqlalchemy.exc
import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core import metrics
from app.db.faults import DbFault, classify, describe

log = structlog.get_logger("treadle.db")

RECHECK_SECONDS = 1.0
"""How long a lag measurement, or a verdict that the replica is not usable, holds."""

CONNECT_TIMEOUT_SECONDS = 5.0
"""asyncpg's connect timeout on the replica (its default is 60 s): a replica host that
does not answer delays at most one read per :data:`RECHECK_SECONDS` by this much. Its
statements also get asyncpg's ``command_timeout``: ``TREADLE_DB_STATEMENT_TIMEOUT_SECONDS``
plus this, so a server that stops answering mid-read (the server's own timeout cannot
fire then) fails the read instead of holding the request forever."""

# Seconds the replica's data trails the primary's. When every WAL record received has
# been replayed the replica is as fresh as the stream: 0, even if the primary has been
# idle for an hour (the last replayed commit is then old, but nothing is missing). A
# server not in recovery (the URL names a primary, or a promoted replica) is never
# behind. Otherwise: the age of the last replayed commit, by the replica's clock against
# the primary's commit time (the PostgreSQL manual, "Monitoring" / pg_stat_replication,
# measures lag the same way); NULL when nothing was replayed since the standby started.
_LAG_SQL = text(
    """
    SELECT pg_is_in_recovery(), CASE
        WHEN NOT pg_is_in_recovery() THEN 0.0
        WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0.0
        ELSE EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())
    END
    """
)


def _unavailable(exc: BaseException) -> bool:
    """True if ``exc`` means the replica cannot serve: a fault, or no answer in time.

    asyncpg raises a bare :class:`TimeoutError` when a connect outlasts its ``timeout``
    (:data:`CONNECT_TIMEOUT_SECONDS`) or a statement its ``command_timeout`` (a replica
    host that stopped answering: frozen, partitioned away). Only the replica's engine
    gets those timeouts, so here that error is the replica's, never a step's own.
    """
    return isinstance(exc, TimeoutError) or classify(exc) is DbFault.UNAVAILABLE


async def replica_status(conn: AsyncConnection) -> tuple[bool, float | None]:
    """Whether the server behind ``conn`` is a standby, and how many seconds it trails.

    Returns:
        ``(in_recovery, lag)``: ``lag`` is 0.0 for a server that is not a standby, None
        when it cannot be told. Runs one statement and ends the transaction it began, so
        the caller can ``begin()`` its own.
    """
    try:
        in_recovery, value = (await conn.execute(_LAG_SQL)).one()
    finally:
        await conn.rollback()
    return bool(in_recovery), None if value is None else max(float(value), 0.0)


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
            in_recovery, lag = await replica_status(conn)
        except Exception as exc:
            await conn.close()
            self._checked_until = float("-inf")
            if not _unavailable(exc):
                raise
            self._skip(now, "unavailable", error=describe(exc))
            return None
        metrics.DB_REPLICA_LAG.set(-1.0 if lag is None else lag)
        self._note_role(in_recovery)
        if lag is None or lag > self.max_lag_seconds:
            await conn.close()
            self._checked_until = float("-inf")
            self._skip(now, "lagging", lag_seconds=lag)
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
