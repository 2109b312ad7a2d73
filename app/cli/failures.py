"""The CLI's expected failures: one line on stderr that says what to do, and an exit code.

docs/operations.md#the-cli ("Exit codes"). Every ``treadle`` command runs inside
:class:`TreadleGroup` (the root group's class), whose :meth:`TreadleGroup.invoke` sends
whatever a command raises through :func:`explain`: the one place that turns a missing or
unreachable database, refused credentials, a schema behind or ahead, an unreachable API
into one line and an exit code (:class:`app.cli.common.ExitCode`), for every command,
in a subprocess as in typer's test runner. Anything :func:`explain` does not know is a
bug and keeps its traceback.

Database errors are named with :mod:`app.db.faults` (:func:`~app.db.faults.misconfiguration`,
:func:`~app.db.faults.classify`, :func:`~app.db.faults.describe`: no SQL text, no
password).
"""

from __future__ import annotations

import socket
import sys
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    # Typer vendors click; its group's invoke() takes that click's Context.
    from typer._click import Context

from app.cli.common import ExitCode
from app.core.text import printable

# The commands that start a long-running process: their refusals read "refusing to start"
# (docs/operations.md, "Schema version check"), the rest name the command.
_STARTING = frozenset({"serve", "worker", "dev"})

_UNREACHABLE_HINT = (
    "check the host and port of TREADLE_DATABASE_URL and that the database server is running"
)


def _database_error(exc: BaseException) -> tuple[str, ExitCode] | None:
    """A database driver's error, when it is one (SQLAlchemy, asyncpg, sqlite3)."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.db import faults

    asyncpg = sys.modules.get("asyncpg")
    drivers: tuple[type[BaseException], ...] = (SQLAlchemyError,)
    if asyncpg is not None:
        drivers += (asyncpg.PostgresError, asyncpg.InterfaceError)
    import sqlite3

    drivers += (sqlite3.Error,)
    # A driver's own error, or what it raised before any wrapping (connection refused).
    if not isinstance(exc, drivers) and faults.classify(exc) is None:
        return None
    mistake = faults.misconfiguration(exc)
    if mistake is not None:
        return mistake, ExitCode.USAGE
    fault = faults.classify(exc)
    if fault is faults.DbFault.UNAVAILABLE:
        return f"cannot reach the database: {faults.describe(exc)[:300]}: {_UNREACHABLE_HINT}", (
            ExitCode.FAILED
        )
    return f"database error: {faults.describe(exc)[:300]}", ExitCode.FAILED


def explain(exc: BaseException, command: str | None) -> tuple[str, ExitCode] | None:
    """The one line and exit code of an expected failure of ``treadle <command>``.

    Args:
        exc: what the command raised.
        command: the top-level command (``migrate``, ``api-keys``, ``serve``), or None.

    Returns:
        ``(line, exit code)``; None for an exception that is not an expected failure
        (a bug: it keeps its traceback). The line starts with ``treadle <command>:``
        (``refusing to start:`` / ``cannot start:`` for ``serve``, ``worker``, ``dev``).
        Exit codes: 2 for what the operator must change (settings, the database's name
        or credentials, a SQLite path, the schema's revision, a refused request), 1 for
        a database that stays unreachable or fails, 3 for an API that cannot be reached.
    """
    from app.core.errors import DatabaseUnreachableAtStart

    explained = _explain(exc)
    if explained is None:
        return None
    line, code = explained
    if command in _STARTING:
        prefix = (
            "cannot start" if isinstance(exc, DatabaseUnreachableAtStart) else ("refusing to start")
        )
    else:
        prefix = f"treadle {command}" if command else "treadle"
    return f"{prefix}: {line}", code


def _explain(exc: BaseException) -> tuple[str, ExitCode] | None:
    from app.core.errors import DatabaseUnreachableAtStart, TreadleError
    from app.db.migrations import MigrationsNotFound

    if isinstance(exc, DatabaseUnreachableAtStart):
        return f"{exc.detail}; {_UNREACHABLE_HINT}", ExitCode.FAILED
    if isinstance(exc, TreadleError):
        # The schema behind or ahead, a pooler or database misconfiguration, handlers
        # that do not load, a domain error of the request: each detail says what to do.
        return exc.detail, ExitCode.USAGE
    if isinstance(exc, MigrationsNotFound):
        return str(exc), ExitCode.FAILED
    database = _database_error(exc)
    if database is not None:
        return database
    # httpx is looked up, not imported: `treadle worker` never loads it, and an httpx
    # error needs httpx loaded (a command that talks HTTP without app.client).
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(exc, httpx.TransportError):
        return f"cannot reach the API: {exc} (check --url / TREADLE_URL)", ExitCode.UNREACHABLE
    if isinstance(exc, socket.gaierror):
        return (
            f"cannot resolve the database host: {exc}: check the host of TREADLE_DATABASE_URL",
            ExitCode.USAGE,
        )
    if isinstance(exc, OSError):
        # Creating the SQLite file's directory, reading a file the settings name.
        where = f" {exc.filename!s}" if exc.filename else ""
        return (
            f"cannot open{where}: {exc.strerror or exc}: check TREADLE_DATABASE_URL "
            "(a SQLite file's directory must exist or be creatable, and be writable)",
            ExitCode.USAGE,
        )
    return None


def report(exc: BaseException, command: str | None) -> None:
    """Print :func:`explain`'s line for ``exc`` and exit with its code, or re-raise.

    Raises:
        typer.Exit: with the failure's exit code, after printing its line.
        BaseException: ``exc`` itself when it is not an expected failure.
    """
    explained = explain(exc, command)
    if explained is None:
        raise exc
    line, code = explained
    typer.secho(printable(" ".join(line.split())), fg=typer.colors.RED, err=True)
    raise typer.Exit(int(code)) from None


class TreadleGroup(TyperGroup):
    """The root command group: every command's expected failures through :func:`report`."""

    def invoke(self, ctx: Context) -> Any:
        """Run the command line; an expected failure ends it with one line and its code.

        typer's own exits and usage errors are none of :func:`explain`'s: re-raised.
        """
        try:
            return super().invoke(ctx)
        except Exception as exc:  # noqa: BLE001 - explained, or re-raised by report()
            report(exc, ctx.invoked_subcommand)
