"""app/cli/failures.py's mapping, in-process: what it explains, and what it leaves alone.

The real CLI against real databases is tests/acceptance/test_cli_failures.py; here, the
boundary: a bug keeps its traceback (explain() answers None and the group re-raises), a
domain error or a driver's error is one line with its documented code.
"""

from __future__ import annotations

import sqlite3

import pytest
import typer
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from app.cli.common import ExitCode
from app.cli.failures import TreadleGroup, explain
from app.core.errors import SchemaVersionMismatch
from app.db.faults import misconfiguration


def _sqlite_error(message: str, name: str) -> OperationalError:
    orig = sqlite3.OperationalError(message)
    orig.sqlite_errorname = name
    return OperationalError("SELECT 1", {}, orig)


def test_a_bug_is_not_explained_and_keeps_its_traceback() -> None:
    assert explain(ValueError("a bug"), "migrate") is None
    app = typer.Typer(cls=TreadleGroup)

    @app.command()
    def broken() -> None:
        raise ValueError("a bug")

    @app.command()
    def behind() -> None:
        raise SchemaVersionMismatch("database schema is at 0001: run `treadle migrate`")

    result = CliRunner().invoke(app, ["broken"])
    assert isinstance(result.exception, ValueError)
    result = CliRunner().invoke(app, ["behind"])
    assert result.exit_code == ExitCode.USAGE
    assert (
        result.output.strip() == "treadle behind: database schema is at 0001: run `treadle migrate`"
    )


@pytest.mark.parametrize(
    ("error", "code", "fragment"),
    [
        (_sqlite_error("unable to open database file", "SQLITE_CANTOPEN"), 2, "directory"),
        (
            _sqlite_error("attempt to write a readonly database", "SQLITE_READONLY_DBMOVED"),
            2,
            "read-only",
        ),
        (_sqlite_error("disk I/O error", "SQLITE_IOERR_WRITE"), 1, "database error: disk I/O"),
        (ConnectionRefusedError(111, "Connect call failed"), 1, "check the host and port"),
    ],
)
def test_driver_errors_are_one_line_with_their_code(
    error: BaseException, code: int, fragment: str
) -> None:
    explained = explain(error, "api-keys")
    assert explained is not None
    line, got = explained
    assert (got, line.startswith("treadle api-keys: ")) == (code, True)
    assert fragment in line and "\n" not in line, line
    if code == 2:
        assert misconfiguration(error) is not None
