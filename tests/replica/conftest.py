"""A private PostgreSQL primary with a real streaming hot standby, once per package.

``initdb`` of a primary on a free port (as ``benchmarks/chaos.py`` does; as the
``postgres`` user when the tests run as root), a migrated ``treadle`` database and a
migrated template, then ``pg_basebackup -R`` into a second data directory, started as a
hot standby on another port, and waited for until its WAL receiver is ``streaming``.
Both servers are stopped (immediate mode) whatever the tests did. Self-contained: it
shares no server with the rest of the suite.

Lag is the age on the standby of the heartbeat an API process writes on the primary
(app/db/replica.py): tests that read through an in-process :class:`Database` run that
writer themselves (:func:`heartbeating`). :meth:`StreamingPair.cut_off` severs the
standby's replication connection (its WAL receiver then dials a port nobody listens on);
:meth:`StreamingPair.reconnect` restores it.

The primary lists the standby in ``synchronous_standby_names`` but keeps
``synchronous_commit = off`` server-wide, so commits never wait for it (replay can be
paused without stalling the primary); a database that wants read-your-writes through
the standby sets ``synchronous_commit = remote_apply`` for itself
(:meth:`StreamingPair.clone`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import asyncpg
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import make_url, text

from app.core.settings import AuthMode, Settings
from app.core.tasks import cancel_and_wait
from app.db.database import Database
from app.db.migrations import upgrade_to_head
from app.db.replica import ReplicaHeartbeat, heartbeat_interval
from benchmarks.chaos import PG_BIN, Cluster
from tests.acceptance.conftest import free_port
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for

DATABASE = "treadle"
TEMPLATE = "treadle_replica_tpl"


async def _sql(dsn: str, sql: str) -> object:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def sql(dsn: str, statement: str) -> object:
    """Run one statement on ``dsn`` (a plain ``postgresql://`` URL); its first value.

    Not inside a running event loop: async tests await :func:`asql`.
    """
    return asyncio.run(_sql(dsn, statement))


async def asql(dsn: str, statement: str) -> object:
    """:func:`sql` for async tests."""
    return await _sql(dsn, statement)


class Server(Cluster):
    """One server of the pair (``benchmarks.chaos.Cluster`` plus replication options)."""

    def start(self) -> None:
        """Start with the options a primary and its standby need; wait for connections."""
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            "-c max_connections=100 -c fsync=off -c synchronous_commit=off "
            "-c synchronous_standby_names=* -c wal_level=replica -c max_wal_senders=4 "
            "-c hot_standby=on -c wal_receiver_status_interval=1"
        )
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-l", str(self.log), "-o", options,
            "-w", "-t", "120", "start",
        )  # fmt: skip

    def kill(self) -> None:
        """Immediate shutdown; nothing if it is not running."""
        subprocess.run(
            [*self._as, str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-m", "immediate", "stop"],
            capture_output=True,
            check=False,
        )

    def dsn(self, database: str = "postgres") -> str:
        """The DSN (for asyncpg) of a database on this server."""
        return self.url(database, driver="postgresql")


@dataclass
class StreamingPair:
    """The primary and its streaming standby."""

    primary: Server
    standby: Server
    _conninfo: str | None = field(default=None, repr=False)  # while cut off: the real one

    def clone(self, *, remote_apply: bool) -> str:
        """A new database cloned from the migrated template on the primary; its name.

        ``remote_apply``: its commits return only once the standby has applied them, so
        a read there right after a write sees it (the PostgreSQL manual,
        ``synchronous_commit``). The clone reaches the standby by replication: this
        returns once the standby has it.
        """
        name = f"r_{uuid.uuid4().hex[:12]}"
        sql(self.primary.dsn(), f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
        if remote_apply:
            sql(
                self.primary.dsn(), f'ALTER DATABASE "{name}" SET synchronous_commit = remote_apply'
            )
        self.wait_database(name)
        return name

    def wait_database(self, name: str, timeout: float = 60) -> None:
        """Wait until database ``name``, created on the primary, exists on the standby."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(asyncpg.InvalidCatalogNameError):
                sql(self.standby.dsn(name), "SELECT 1")
                return
            assert time.monotonic() < deadline, f"database {name} did not reach the standby"
            time.sleep(0.05)

    async def pause_replay(self) -> None:
        """Stop applying WAL on the standby (it keeps receiving); wait until paused."""
        await asql(self.standby.dsn(), "SELECT pg_wal_replay_pause()")
        deadline = time.monotonic() + 60
        while await asql(self.standby.dsn(), "SELECT pg_get_wal_replay_pause_state()") != (
            "paused"
        ):
            assert time.monotonic() < deadline, "standby replay did not pause"
            await asyncio.sleep(0.05)

    async def resume_replay(self) -> None:
        """Apply WAL again on the standby."""
        await asql(self.standby.dsn(), "SELECT pg_wal_replay_resume()")

    async def cut_off(self) -> None:
        """Sever the standby from the primary; wait until its WAL receiver no longer streams.

        Its ``primary_conninfo`` is set to a port nobody listens on and reloaded: the
        standby stops its WAL receiver and starts one on the new conninfo (PostgreSQL 13
        and later), whose connects are refused, as by a primary that is gone or a network
        that drops the standby. The standby itself stays up and answers queries.
        """
        assert self._conninfo is None, "already cut off"
        standby = self.standby.dsn()
        conninfo = await asql(standby, "SHOW primary_conninfo")
        assert isinstance(conninfo, str) and conninfo, "the standby has no primary_conninfo"
        self._conninfo = conninfo
        dead = f"host=127.0.0.1 port={free_port()} user=postgres connect_timeout=2"
        await asql(standby, f"ALTER SYSTEM SET primary_conninfo = {_literal(dead)}")
        await asql(standby, "SELECT pg_reload_conf()")

        async def not_streaming() -> bool:
            streaming = await asql(
                standby, "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'"
            )
            return streaming == 0

        await wait_for(not_streaming, timeout=60, interval=0.05, what="the WAL receiver cut")

    async def reconnect(self) -> None:
        """Undo :meth:`cut_off`; wait until the standby streams from the primary again."""
        assert self._conninfo is not None, "not cut off"
        standby = self.standby.dsn()
        await asql(standby, f"ALTER SYSTEM SET primary_conninfo = {_literal(self._conninfo)}")
        await asql(standby, "SELECT pg_reload_conf()")
        self._conninfo = None
        await asyncio.to_thread(_wait_streaming, self.standby)

    def stop_standby(self) -> None:
        """Shut the standby down (fast: its connections are cut)."""
        self.standby.stop()

    def start_standby(self) -> None:
        """Start the standby again; wait until it streams and has replayed a commit.

        Blocking (call it from a thread in an async test).
        """
        self.standby.start()
        _wait_streaming(self.standby)
        sql(self.primary.dsn(), "INSERT INTO replayed DEFAULT VALUES")
        _wait_replayed(self.standby)


def _literal(value: str) -> str:
    """``value`` as an SQL string literal (ALTER SYSTEM takes no parameters)."""
    return "'" + value.replace("'", "''") + "'"


def _wait_streaming(standby: Server, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            state = sql(standby.dsn(), "SELECT status FROM pg_stat_wal_receiver")
            if state == "streaming":
                return
        assert time.monotonic() < deadline, f"standby not streaming: {standby.log.read_text()}"
        time.sleep(0.1)


def _wait_replayed(standby: Server, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while sql(standby.dsn(), "SELECT pg_last_xact_replay_timestamp()") is None:
        assert time.monotonic() < deadline, "the standby replayed no commit"
        time.sleep(0.05)


@pytest.fixture(scope="package")
def pair() -> Iterator[StreamingPair]:
    """A primary with a migrated ``treadle`` database and template, and its hot standby."""
    if not (PG_BIN / "pg_basebackup").exists():
        pytest.skip("PostgreSQL binaries not found")
    # Not under pytest's tmp_path: its root is private to the user running the tests,
    # and the servers may run as the postgres user (see benchmarks.chaos.Cluster).
    root = Path(tempfile.mkdtemp(prefix="treadle-replica-"))
    root.chmod(0o755)  # each server's own directory below is private to it
    (root / "primary").mkdir()
    (root / "standby").mkdir()
    primary = Server(root / "primary")
    standby = Server(root / "standby")
    try:
        primary.init()
        primary.start()
        for name in (DATABASE, TEMPLATE):
            sql(primary.dsn(), f'CREATE DATABASE "{name}"')
            upgrade_to_head(primary.url(name))
        # -R writes standby.signal and primary_conninfo; -X stream brings the WAL of the
        # copy itself; -c fast: an immediate checkpoint rather than a spread one.
        standby.dir.rmdir()
        standby._run(
            str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres", "-D", str(standby.dir), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        standby.start()
        _wait_streaming(standby)
        # Until the standby replays a commit its lag cannot be told (no replayed commit
        # time): one commit, so that the tests start from a standby whose lag is known.
        sql(primary.dsn(), "CREATE TABLE replayed (at timestamptz DEFAULT now())")
        _wait_replayed(standby)
        yield StreamingPair(primary, standby)
    finally:
        standby.kill()
        primary.kill()
        shutil.rmtree(root, ignore_errors=True)


def replica_settings(pair: StreamingPair, tmp: Path, read_url: str, max_lag: float) -> Settings:
    """Settings of an in-process :class:`Database`: the pair's primary, ``read_url`` as replica."""
    return Settings(
        database_url=pair.primary.url(DATABASE),
        read_database_url=read_url,
        read_max_lag_seconds=max_lag,
        auth_mode=AuthMode.DEV,
        dev_secret=DEV_SECRET,
        data_dir=tmp / "data",
    )


async def served_by_standby(db: Database) -> bool:
    """Whether :meth:`Database.lagging_read` on ``db`` served the next read on the standby."""
    async with db.lagging_read() as conn:
        return bool((await conn.execute(text("SELECT pg_is_in_recovery()"))).scalar_one())


def fallbacks(reason: str) -> float:
    """``treadle_db_replica_fallbacks_total{reason}`` of this process."""
    return (
        REGISTRY.get_sample_value("treadle_db_replica_fallbacks_total", {"reason": reason}) or 0.0
    )


def gauge(name: str) -> float | None:
    """A label-less gauge of this process (``treadle_db_replica_up``, ``..._lag_seconds``)."""
    return REGISTRY.get_sample_value(name)


def metric(body: str, name: str, labels: str = "") -> float | None:
    """A sample of a ``/metrics`` scrape: ``labels`` as written there, e.g. ``{reason="x"}``."""
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", body, re.M)
    return None if match is None else float(match.group(1))


@contextlib.asynccontextmanager
async def heartbeating(pair: StreamingPair, db: Database) -> AsyncIterator[ReplicaHeartbeat]:
    """Run the replica heartbeat on ``db``'s primary, as the API does, while inside.

    Waits until the standby has applied the first beat, so a read right after entering
    meets a fresh heartbeat there (and a test that expects the standby starts from one).
    """
    writer = ReplicaHeartbeat(db, heartbeat_interval(db.settings.read_max_lag_seconds))
    assert await writer.beat_once(), "the first heartbeat failed"
    async with db.read() as conn:
        written = (await conn.execute(text("SELECT beat_at FROM replica_heartbeat"))).scalar_one()
    name = make_url(db.url).database
    assert name is not None
    standby = pair.standby.dsn(name)

    async def replayed() -> bool:
        seen = await asql(standby, "SELECT beat_at FROM replica_heartbeat")
        return isinstance(seen, datetime) and seen >= written

    await wait_for(replayed, timeout=60, what="the first heartbeat on the standby")
    stopping = asyncio.Event()
    task = asyncio.create_task(writer.run(stopping), name="replica-heartbeat")
    try:
        yield writer
    finally:
        stopping.set()
        await cancel_and_wait([task])
