"""Shared fixtures: an isolated, migrated database per test on PostgreSQL and SQLite.

PostgreSQL: one template database is migrated per session; each test gets
``CREATE DATABASE … TEMPLATE`` of it. SQLite: a migrated template file is copied per test.
The PostgreSQL server is ``TREADLE_TEST_PG`` (default ``postgres@127.0.0.1:5432``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import structlog

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
    same global configuration would then write to a closed file.
    """
    yield
    structlog.reset_defaults()


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


@pytest.fixture
def make_pg_database(pg_template: str) -> Iterator[Callable[[], str]]:
    """Factory of fresh PostgreSQL databases cloned from the template; dropped after."""
    created: list[str] = []

    def make() -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        asyncio.run(
            _pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}" STRATEGY FILE_COPY')
        )
        created.append(name)
        return pg_url(name)

    yield make
    for name in created:
        asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


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
