"""Shared fixtures: an isolated, migrated database per test on PostgreSQL and SQLite.

PostgreSQL: one template database is migrated per session; each test gets
``CREATE DATABASE … TEMPLATE`` of it, made ahead while the previous test runs
(:class:`PgClones`). SQLite: a migrated template file is copied per test.
The PostgreSQL server is ``TREADLE_TEST_PG`` (default ``postgres@127.0.0.1:5432``).

``pgbouncer``: the same PostgreSQL clone reached through a PgBouncer of the session's own
in transaction pooling mode (:class:`PgBouncer`); tests opt in with
:data:`WITH_PGBOUNCER` (docs/deployment.md, "Behind PgBouncer").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
import structlog
from sqlalchemy.engine import make_url

from app.core.logging import STEP_LOGGER
from app.core.settings import AuthMode, DbPooler, Settings
from app.db.database import Database
from app.db.migrations import upgrade_to_head

PG_SERVER = os.environ.get("TREADLE_TEST_PG", "postgres@127.0.0.1:5432")
DEV_SECRET = "test-secret-" + "x" * 40
PGBOUNCER = os.environ.get("TREADLE_TEST_PGBOUNCER", "/usr/sbin/pgbouncer")

PGBOUNCER_POOL_SIZE = 2
"""Server connections PgBouncer opens per database: fewer than any process's pool, so
client connections really take turns on them."""

WITH_PGBOUNCER = pytest.mark.parametrize(
    "database_url", ["sqlite", "postgresql", "pgbouncer"], indirect=True
)
"""Mark a test to run through PgBouncer too, beside its SQLite and PostgreSQL runs."""

POOLED: dict[str, str] = {}
"""URL through PgBouncer -> direct URL of the same database, for the tests' databases."""


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Undo a test's ``configure_logging``: it binds the ``sys.stderr`` of that moment.

    A command run through typer's ``CliRunner`` configures logging onto the runner's
    stream, which is closed once the command returns; a later test logging through the
    same global configuration would then write to a closed file. The same goes for the
    stdlib root handler it installs (and the levels it sets), so they are put back too.
    """
    root = logging.getLogger()
    level = root.level
    step_level = logging.getLogger(STEP_LOGGER).level
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    # Only the handlers configure_logging installed: pytest's own come and go per phase.
    for handler in list(root.handlers):
        if isinstance(handler.formatter, structlog.stdlib.ProcessorFormatter):
            root.removeHandler(handler)
    root.setLevel(level)
    logging.getLogger(STEP_LOGGER).setLevel(step_level)
    logging.captureWarnings(False)


def pg_url(database: str, driver: str = "postgresql+asyncpg") -> str:
    """SQLAlchemy URL of a database on the test server."""
    return f"{driver}://{PG_SERVER}/{database}"


async def _pg_admin(sql: str) -> None:
    conn = await asyncpg.connect(f"postgresql://{PG_SERVER}/postgres")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """Name of a migrated template database (created once per session)."""
    name = f"treadle_tpl_{os.getpid()}"
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}"'))
    asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
    upgrade_to_head(pg_url(name))
    yield name
    asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a migrated template SQLite file (created once per session)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade_to_head(f"sqlite+aiosqlite:///{path}")
    return path


class PgClones:
    """Fresh clones of the template database, the next one made ahead in a thread.

    A clone takes 0.1-1 s of the PostgreSQL server's time (more while other tests write),
    and every PostgreSQL test needs one before it starts: made while the previous test runs,
    it is ready when asked for. Each clone is still a new database used by one test only.
    Drops run on the same thread after the test; a failed clone or drop is raised (in the
    test that asked for the clone, or when the session closes the pool).
    """

    def __init__(self, template: str) -> None:
        self.template = template
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-clones")
        self._next: Future[str] | None = None
        self._drops: list[Future[None]] = []

    def _clone(self) -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        # The server's default strategy (WAL_LOG since PostgreSQL 15) copies the template's
        # few MB through the WAL; FILE_COPY forces two checkpoints per clone, which flush
        # every database's dirty pages (docs/adr/0019-test-parallelism.md).
        asyncio.run(_pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
        return name

    def _drop(self, name: str) -> None:
        asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def take(self) -> str:
        """A new clone's name (waits for the one being made); starts making the next."""
        made = self._next or self._thread.submit(self._clone)
        self._next = None
        name = made.result()
        self._next = self._thread.submit(self._clone)
        return name

    def drop(self, name: str) -> None:
        """Drop clone ``name`` on the pool's thread (its errors surface at :meth:`close`)."""
        self._drops.append(self._thread.submit(self._drop, name))

    def close(self) -> None:
        """Drop the clone made ahead, wait for every drop; raise the first failure."""
        if self._next is not None:
            with contextlib.suppress(Exception):  # a failed clone left nothing to drop
                self.drop(self._next.result())
        self._thread.shutdown(wait=True)
        for dropped in self._drops:
            dropped.result()


@pytest.fixture(scope="session")
def pg_clones(pg_template: str) -> Iterator[PgClones]:
    """The session's :class:`PgClones` of the template (closed before it is dropped)."""
    clones = PgClones(pg_template)
    yield clones
    clones.close()


@pytest.fixture
def make_pg_database(pg_clones: PgClones) -> Iterator[Callable[[], str]]:
    """Factory of fresh PostgreSQL databases cloned from the template; dropped after."""
    created: list[str] = []

    def make() -> str:
        name = pg_clones.take()
        created.append(name)
        return pg_url(name)

    yield make
    for name in created:
        pg_clones.drop(name)


class PgBouncer:
    """A PgBouncer process of this session: transaction pooling in front of ``PG_SERVER``.

    Its own ini and userlist in a temporary directory, a free port, ``pool_mode =
    transaction`` and :data:`PGBOUNCER_POOL_SIZE` server connections per database; any
    database name is passed through to the server's database of that name (``*`` in
    ``[databases]``). Trust authentication, like the test server. Run in the foreground
    so the fixture owns the process; PgBouncer refuses to run as root, so as root it
    switches to the ``postgres`` user (``-u``).
    """

    def __init__(self) -> None:
        server = urlsplit(f"//{PG_SERVER}")
        self.user = server.username or "postgres"
        self.dir = Path(tempfile.mkdtemp(prefix="treadle-pgbouncer-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server.hostname or '127.0.0.1'} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {PGBOUNCER_POOL_SIZE}\n"
            "max_client_conn = 500\n"
            f"admin_users = {self.user}\n"
            # A client queued for a server connection fails after this instead of
            # hanging the test until its timeout.
            "query_wait_timeout = 60\n"
        )
        self.log = self.dir / "pgbouncer.log"
        as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
        if as_user:
            shutil.chown(self.dir, "postgres")
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [PGBOUNCER, *as_user, str(self.dir / "pgbouncer.ini")],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log.read_text()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pgbouncer not listening: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)

    def url(self, database: str, driver: str = "postgresql+asyncpg") -> str:
        """SQLAlchemy URL of ``database`` through this PgBouncer."""
        return f"{driver}://{self.user}@127.0.0.1:{self.port}/{database}"

    def admin(self, command: str) -> list[dict[str, str]]:
        """Rows of an admin console command (``SHOW POOLS``, ``SHOW STATS``) as dicts.

        Through ``psql``: the console speaks the simple query protocol only, and asyncpg
        prepares every query that returns rows.
        """
        done = subprocess.run(
            [
                *("psql", "-X", "-A", "-F", "\t", "-P", "footer=off", "-c", command),
                *("-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", "pgbouncer"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        header, *lines = done.stdout.splitlines()
        names = header.split("\t")
        return [dict(zip(names, line.split("\t"), strict=True)) for line in lines]

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and remove its directory."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[PgBouncer]:
    """The session's :class:`PgBouncer`, stopped when the session ends."""
    bouncer = PgBouncer()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A fresh migrated database URL, once per dialect (and through PgBouncer if asked)."""
    if request.param == "sqlite":
        path = tmp_path / "treadle.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite+aiosqlite:///{path}"
    make: Callable[[], str] = request.getfixturevalue("make_pg_database")
    direct = make()
    if request.param != "pgbouncer":
        return direct
    bouncer: PgBouncer = request.getfixturevalue("pgbouncer")
    name = make_url(direct).database or ""
    # As docs/deployment.md ("Behind PgBouncer") says to: the server applies the
    # statement timeout (make_settings' default, 30 s), not a startup parameter.
    asyncio.run(_pg_admin(f'ALTER DATABASE "{name}" SET statement_timeout = 30000'))
    pooled = bouncer.url(name)
    POOLED[pooled] = direct
    return pooled


def pooler_settings(database_url: str) -> dict[str, Any]:
    """Settings for ``database_url`` when it goes through the test PgBouncer, else none.

    ``db_pooler=transaction`` and LISTEN over the direct URL of the same database.
    """
    direct = POOLED.get(database_url)
    if direct is None:
        return {}
    return {"db_pooler": DbPooler.TRANSACTION, "listen_database_url": direct}


def make_settings(database_url: str, tmp_path: Path, **overrides: Any) -> Settings:
    """Test settings: short leases and polls so crash recovery takes seconds."""
    values: dict[str, Any] = {
        **pooler_settings(database_url),
        "database_url": database_url,
        # Explicit: dev auth on PostgreSQL is refused unless chosen by name.
        "auth_mode": AuthMode.DEV,
        "dev_secret": DEV_SECRET,
        "data_dir": tmp_path / "data",
        "lease_ttl_seconds": 3.0,
        "heartbeat_interval_seconds": 0.5,
        "poll_interval_seconds": 0.05,
        "drain_grace_seconds": 5.0,
        **overrides,
    }
    return Settings(**values)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    """Settings bound to this test's database."""
    return make_settings(database_url, tmp_path)


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[Database]:
    """An open :class:`Database` for this test's database."""
    database = Database(settings)
    yield database
    await database.dispose()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    r"""Make a report's captured output encodable before pytest-xdist sends it.

    Tests feed hostile text (lone surrogates) through loggers on purpose; pytest keeps
    what they logged in the report's sections, and xdist's UTF-8 channel cannot carry a
    lone surrogate: the worker crashed with an INTERNALERROR and took the session down.
    Such characters are shown escaped (``\ud800``), which is what a reader needs.
    """
    report.sections = [
        (title, content.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, content in report.sections
    ]
