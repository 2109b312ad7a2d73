"""Shared fixtures: an isolated, migrated database per test on PostgreSQL and SQLite.

PostgreSQL: one template database is migrated per session; each test gets
``CREATE DATABASE … TEMPLATE`` of it, made ahead while the previous test runs
(:class:`PgClones`). SQLite: a migrated template file is copied per test.
The PostgreSQL server is ``TREADLE_TEST_PG`` (default ``postgres@127.0.0.1:5432``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import structlog

from app.core.logging import STEP_LOGGER
from app.core.settings import AuthMode, Settings
from app.db.database import Database
from app.db.migrations import upgrade_to_head

PG_SERVER = os.environ.get("TREADLE_TEST_PG", "postgres@127.0.0.1:5432")
DEV_SECRET = "test-secret-" + "x" * 40


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


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A fresh migrated database URL, once per dialect."""
    if request.param == "sqlite":
        path = tmp_path / "treadle.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite+aiosqlite:///{path}"
    make: Callable[[], str] = request.getfixturevalue("make_pg_database")
    return make()


def make_settings(database_url: str, tmp_path: Path, **overrides: Any) -> Settings:
    """Test settings: short leases and polls so crash recovery takes seconds."""
    values: dict[str, Any] = {
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
