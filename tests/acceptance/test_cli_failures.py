"""Every ``treadle`` command's expected failures: one line on stderr, the documented code.

The real CLI in a subprocess (``python -m app.cli.main``, the console script's
``main``) against real PostgreSQL and SQLite: a database that does not exist, a closed
port, a user the server refuses, SQLite paths that cannot be created, opened or written,
a schema behind (migrated to an older revision) and ahead (an ``alembic_version`` this
code does not know); and the HTTP operator commands against an API that is not there or
answers 401, 403, 404. docs/operations.md#the-cli ("Exit codes"); the mapping is
app/cli/failures.py's, one place for every command.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from alembic import command
from app.db.migrations import alembic_config, head_revision
from tests.acceptance.conftest import ROOT, Stack, cli_run, free_port, token
from tests.conftest import DEV_SECRET, PG_SERVER, _pg_admin

pytestmark = pytest.mark.timeout(600)

# The commands that open the database themselves, each as its argument list.
DATABASE_COMMANDS: dict[str, Callable[[], list[str]]] = {
    "migrate": lambda: ["migrate"],
    "api-keys": lambda: ["api-keys", "list", "--tenant", "acme"],
    "tenants": lambda: ["tenants", "list"],
    "maintenance": lambda: ["maintenance", "run", "--dry-run"],
    "serve": lambda: ["serve", "--port", str(free_port())],
    "worker": lambda: ["worker", "--handlers", "tests.acceptance.handlers"],
}
NOT_MIGRATE = sorted(set(DATABASE_COMMANDS) - {"migrate"})


def _env(tmp_path: Path, database_url: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")},
        "TREADLE_DATABASE_URL": database_url,
        "TREADLE_DB_START_TIMEOUT_SECONDS": "0",  # a closed port: try once
        "TREADLE_AUTH_MODE": "dev",
        "TREADLE_DEV_SECRET": DEV_SECRET,
        "TREADLE_DATA_DIR": str(tmp_path / "data"),
        "TREADLE_LOG_FORMAT": "json",  # log records (serve's dev-mode warning): JSON lines
        "PYTHONPATH": str(ROOT),
    }


def _fails(tmp_path: Path, database_url: str, name: str, code: int, *fragments: str) -> str:
    """Run ``treadle <name>`` on ``database_url``; assert one line, ``code``, ``fragments``."""
    done = cli_run(_env(tmp_path, database_url), *DATABASE_COMMANDS[name](), timeout=180)
    stderr = done.stderr
    assert "Traceback" not in stderr + done.stdout, stderr
    lines = [line for line in stderr.splitlines() if line.strip() and line[:1] != "{"]
    assert len(lines) == 1, stderr
    assert done.returncode == code, (done.returncode, stderr)
    line = lines[0]
    prefix = "refusing to start:" if name in ("serve", "worker") else f"treadle {name}:"
    if code == 1 and name in ("serve", "worker"):
        prefix = "cannot start:"
    assert line.startswith(prefix), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


@pytest.fixture
def missing_database() -> str:
    return f"postgresql+asyncpg://{PG_SERVER}/treadle_missing_{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("name", sorted(DATABASE_COMMANDS))
def test_a_database_that_does_not_exist(name: str, tmp_path: Path, missing_database: str) -> None:
    _fails(tmp_path, missing_database, name, 2, "does not exist", "create the database")


@pytest.mark.parametrize("name", sorted(DATABASE_COMMANDS))
def test_a_closed_port(name: str, tmp_path: Path) -> None:
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/postgres"
    _fails(tmp_path, url, name, 1, "unreachable", "check the host and port")


@pytest.mark.parametrize("name", sorted(DATABASE_COMMANDS))
def test_a_user_the_server_refuses(name: str, tmp_path: Path) -> None:
    host = make_url(f"postgresql://{PG_SERVER}")
    url = (
        f"postgresql+asyncpg://no_such_role_{uuid.uuid4().hex[:8]}@{host.host}:{host.port}/postgres"
    )
    _fails(tmp_path, url, name, 2, "(SQLSTATE 28", "refused these credentials")


@pytest.mark.parametrize("name", sorted(DATABASE_COMMANDS))
def test_sqlite_paths_that_cannot_be_created_or_opened(name: str, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    under_a_file = f"sqlite+aiosqlite:///{tmp_path / 'a-file' / 'sub' / 'treadle.db'}"
    _fails(tmp_path, under_a_file, name, 2, "a-file", "check TREADLE_DATABASE_URL")
    (tmp_path / "a-dir").mkdir()
    a_directory = f"sqlite+aiosqlite:///{tmp_path / 'a-dir'}"
    _fails(tmp_path, a_directory, name, 2, "SQLITE_CANTOPEN", "writable")


def test_sqlite_that_cannot_be_written(tmp_path: Path) -> None:
    """Read-only (as root, file modes do not stop a write: SQLite's ``mode=ro`` does)."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    read_only = f"sqlite+aiosqlite:///file:{empty}?mode=ro&uri=true"
    _fails(tmp_path, read_only, "migrate", 2, "SQLITE_READONLY", "make it and its directory")
    migrated = tmp_path / "migrated.db"
    command.upgrade(alembic_config(f"sqlite+aiosqlite:///{migrated}"), "head")
    env = _env(tmp_path, f"sqlite+aiosqlite:///file:{migrated}?mode=ro&uri=true")
    done = cli_run(
        env, "api-keys", "create", "--tenant", "acme", "--name", "x", "--scopes", "runs:read"
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith("treadle api-keys: attempt to write a readonly")


def _schema_database(dialect: str, tmp_path: Path) -> str:
    if dialect == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'schema.db'}"
    name = f"treadle_schema_{uuid.uuid4().hex[:12]}"
    asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
    return f"postgresql+asyncpg://{PG_SERVER}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def schema_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each dialect, dropped after the test."""
    url = _schema_database(request.param, tmp_path)
    yield url
    if request.param == "postgresql":
        name = make_url(url).database
        asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _previous_revision() -> str:
    script = alembic_config("unused")
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(script).get_revision(head_revision())
    assert head is not None and isinstance(head.down_revision, str)
    return head.down_revision


async def _set_version(url: str, revision: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": revision})
    finally:
        await engine.dispose()


def test_schema_behind_is_refused_and_migrate_brings_it_to_head(
    schema_url: str, tmp_path: Path
) -> None:
    older = _previous_revision()
    command.upgrade(alembic_config(schema_url), older)
    for name in NOT_MIGRATE:
        _fails(tmp_path, schema_url, name, 2, f"schema is at {older}", "run `treadle migrate`")
    done = cli_run(_env(tmp_path, schema_url), "migrate", timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"database at revision {head_revision()}"


def test_schema_ahead_is_refused_by_every_command(schema_url: str, tmp_path: Path) -> None:
    command.upgrade(alembic_config(schema_url), "head")
    asyncio.run(_set_version(schema_url, "9999_from_the_future"))
    for name in sorted(DATABASE_COMMANDS):
        _fails(
            tmp_path,
            schema_url,
            name,
            2,
            "9999_from_the_future",
            "deploy the newer Treadle release",
        )


# --- the HTTP operator commands -----------------------------------------------------------


def _one_line(done: object) -> str:
    stderr = str(getattr(done, "stderr", ""))
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_api_unreachable_is_exit_3(stack_env: dict[str, str]) -> None:
    env = {**stack_env, "TREADLE_URL": f"http://127.0.0.1:{free_port()}", "TREADLE_TOKEN": "t"}
    for args in (["runs", "list"], ["dlq", "list"], ["schedules", "list"], ["webhooks", "list"]):
        done = cli_run(env, *args)
        assert done.returncode == 3, (args, done.stderr)
        assert "check --url / TREADLE_URL" in _one_line(done), done.stderr


def test_api_401_403_404_say_what_to_do(stack: Stack) -> None:
    env = {**stack.env, "TREADLE_URL": stack.url}
    bad = cli_run({**env, "TREADLE_TOKEN": "not-a-token"}, "runs", "list")
    assert bad.returncode == 1
    line = _one_line(bad)
    assert line.startswith("error: 401") and "check --token / TREADLE_TOKEN" in line, line
    narrow = token(scopes=["runs:read"])
    refused = cli_run({**env, "TREADLE_TOKEN": narrow}, "webhooks", "list")
    assert refused.returncode == 1
    line = _one_line(refused)
    assert line.startswith("error: 403") and "use a token with the scope" in line, line
    missing = cli_run({**env, "TREADLE_TOKEN": token()}, "runs", "get", str(uuid.uuid4()))
    assert missing.returncode == 1
    line = _one_line(missing)
    assert line.startswith("error: 404") and "check the id" in line, line
    # -o json changes the answer's format, not the error's line.
    assert json.loads(
        cli_run({**env, "TREADLE_TOKEN": token()}, "runs", "list", "-o", "json").stdout
    )
