"""``treadle worker --check``: the worker's health check, for a container HEALTHCHECK.

A worker has no HTTP port of its own (its metrics port is optional), so its image's health
check runs this in a second process: it answers "could a worker with these settings and
these ``--handlers`` start and do work right now?" and exits 0 (yes) or 1 (no, with one
line saying which check failed). It never claims a run and writes nothing.
"""

from __future__ import annotations

import asyncio

import typer
from sqlalchemy import text

from app.core.errors import HandlersNotLoaded, SchemaVersionMismatch
from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import check_schema, head_revision
from app.engine.registry import Registry

# A health check that hangs is worse than one that fails: the container runtime would
# wait for its own timeout and report nothing useful.
CHECK_TIMEOUT_SECONDS = 10.0


def worker_check(settings: Settings, handler_modules: list[str]) -> int:
    """Run the three checks in order and return the exit code (0 healthy, 1 not).

    Checks, each printed as one line: the ``--handlers`` modules import and define
    workflows; the database answers ``SELECT 1`` within ``CHECK_TIMEOUT_SECONDS``; its
    schema is at this code's Alembic head (``treadle migrate``).

    Args:
        settings: the worker's settings (``TREADLE_*``).
        handler_modules: the same ``--handlers`` the worker runs with.

    Returns:
        0 when every check passes, else 1 (after printing the failed check to stderr).
    """
    try:
        registry = Registry.from_modules(handler_modules)
    except (HandlersNotLoaded, ValueError) as exc:
        return _unhealthy(f"handlers: {exc}")
    typer.echo(f"ok handlers: {len(registry)} workflow(s) from {', '.join(handler_modules)}")
    try:
        asyncio.run(asyncio.wait_for(_database(settings), CHECK_TIMEOUT_SECONDS))
    except SchemaVersionMismatch as exc:
        return _unhealthy(f"schema: {exc.detail}")
    except TimeoutError:
        return _unhealthy(f"database: no answer within {CHECK_TIMEOUT_SECONDS:g} s")
    except Exception as exc:  # noqa: BLE001 - any driver error means "unreachable", one line
        return _unhealthy(f"database: unreachable ({type(exc).__name__}: {exc})")
    typer.echo(f"ok database: reachable, schema at {head_revision()}")
    return 0


async def _database(settings: Settings) -> None:
    db = Database(settings)
    try:
        async with db.read() as conn:
            # Reachability first, so an unreachable server is not reported as an empty schema.
            await conn.execute(text("SELECT 1"))
        await check_schema(db)
    finally:
        await db.dispose()


def _unhealthy(message: str) -> int:
    typer.secho(f"unhealthy {message}", fg=typer.colors.RED, err=True)
    return 1
