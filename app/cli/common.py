"""What every ``treadle`` command group shares: exit codes, ``-o``, errors, the API client.

Conventions (docs/operations.md#the-cli):

- exit codes: 0 ok; 1 a failed (or unfinished) run, an error answer from the API, a
  database that stays unreachable or fails; 2 usage and configuration (bad option,
  invalid settings, unreadable ``--input``, no such database, refused credentials, a
  SQLite file that cannot be opened or written, the schema behind or ahead); 3 the API
  cannot be reached. The database and start-up failures are
  :func:`app.cli.failures.explain`'s, for every command.
- ``-o`` / ``--output``: ``table`` (rich, the default) or ``json`` on every command that
  prints an API answer; the report and maintenance also take ``text``.
- errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import json as stdjson
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import BaseModel

from app.core.errors import InvalidInput
from app.core.json import parse_text
from app.core.text import printable

if TYPE_CHECKING:
    # Imported where used: app.client (httpx, its pydantic models) is the API commands'
    # alone, and `treadle serve` / `treadle worker` import this module too.
    from app.client import TreadleAPIError, TreadleClient


class ExitCode(IntEnum):
    """Exit statuses of every ``treadle`` command."""

    OK = 0
    FAILED = 1
    """A run that failed or did not finish, an error answer (4xx/5xx) from the API, or a
    database that stayed unreachable or failed (app/cli/failures.py)."""
    USAGE = 2
    """Bad arguments or settings (click's own usage errors are 2 as well), a database
    that does not exist, refuses the credentials or cannot be opened, a schema behind or
    ahead of this code, a request the database commands refuse."""
    UNREACHABLE = 3
    """No answer from the API: connection refused, DNS, timeout."""


class Output(StrEnum):
    """``-o`` values of commands that print an API answer."""

    TABLE = "table"
    JSON = "json"


OUTPUT = Annotated[
    Output,
    typer.Option("--output", "-o", help="table (default) or json", case_sensitive=False),
]
URL = Annotated[str, typer.Option("--url", envvar="TREADLE_URL", help="API base URL")]
TOKEN = Annotated[str | None, typer.Option("--token", envvar="TREADLE_TOKEN", help="Bearer token")]
DEFAULT_URL = "http://127.0.0.1:8000"
CLIENT_TIMEOUT = 30.0
"""Seconds for one request (long-polls add their wait)."""


def fail(message: str, code: int = ExitCode.USAGE) -> NoReturn:
    """Print ``message`` as one red line on stderr and exit with ``code``."""
    line = " ".join(message.split()) if "\n" not in message else message
    typer.secho(printable(line, keep="\n"), fg="red", err=True)
    raise typer.Exit(int(code))


def note(message: str) -> None:
    """A progress or hint line on stderr (stdout stays the answer, for pipes)."""
    typer.secho(printable(message, keep="\n"), err=True, dim=True)


# What to do about the answers an operator's command gets for its credentials or ids.
_WHAT_TO_DO = {
    401: "check --token / TREADLE_TOKEN: missing, expired, revoked or not for this "
    "server (dev: `treadle token`)",
    403: "use a token with the scope this command needs, for a tenant that is not suspended",
    404: "check the id, and the tenant of the token: another tenant's resources are not found",
}


def describe(exc: TreadleAPIError) -> str:
    """One line for an error answer: status, code, detail, field errors, what to do.

    401, 403 and 404 end with what to do (:data:`_WHAT_TO_DO`); other answers' details
    say it themselves.
    """
    line = f"error: {exc}"
    fields = exc.problem.get("errors")
    if isinstance(fields, list) and fields:
        parts = [f"{e.get('path')}: {e.get('message')}" for e in fields[:5] if isinstance(e, dict)]
        line += " (" + "; ".join(parts) + (", …" if len(fields) > 5 else "") + ")"
    hint = _WHAT_TO_DO.get(exc.status or 0)
    return f"{line} — {hint}" if hint else line


@contextmanager
def api_client(url: str, tok: str | None) -> Iterator[TreadleClient]:
    """A :class:`TreadleClient` whose errors end the command with one line.

    :class:`TreadleUnreachable` exits 3, any other :class:`TreadleAPIError` exits 1.
    """
    from app.client import TreadleAPIError, TreadleClient, TreadleUnreachable

    if not tok:
        fail("no token: pass --token or set TREADLE_TOKEN (dev: `treadle token`)")
    try:
        with TreadleClient(url, tok, timeout=CLIENT_TIMEOUT) as client:
            yield client
    except TreadleUnreachable as exc:
        fail(f"{exc.detail} (is `treadle serve` running? check --url / TREADLE_URL)", 3)
    except TreadleAPIError as exc:
        fail(describe(exc), ExitCode.FAILED)


def read_json_option(text: str | None, option: str) -> Any:
    """Parse a JSON option value, or ``@file.json``; exit 2 naming ``option`` if bad."""
    if text is None:
        return None
    try:
        raw = Path(text[1:]).read_text() if text.startswith("@") else text
    except OSError as exc:
        fail(f"{option}: cannot read {text[1:]!r}: {exc.strerror}")
    try:
        return parse_text(raw, option)
    except InvalidInput as exc:
        fail(exc.detail)


def parse_time(text: str | None, option: str) -> datetime | None:
    """ISO 8601 date or time (``2026-05-01``, ``2026-05-01T10:00:00+02:00``); naive = UTC."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        fail(f"{option}: {text!r} is not an ISO 8601 date/time (e.g. 2026-05-01T10:00:00Z)")
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# --- printing ----------------------------------------------------------------------------


def _jsonable(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list):
        return [_jsonable(d) for d in data]
    if isinstance(data, dict):
        return {k: _jsonable(v) for k, v in data.items()}
    return data


def print_json(data: Any) -> None:
    """Pretty JSON on stdout (models dumped in JSON mode, unicode kept).

    Through :func:`app.core.text.printable`: a lone surrogate cannot crash the terminal's
    encoder, nor ESC or an RTL override rewrite the screen; the escapes land inside JSON
    strings, so the output stays valid, equal JSON (docs/security.md).
    """
    typer.echo(printable(stdjson.dumps(_jsonable(data), indent=2, ensure_ascii=False), keep="\n"))


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict) and "traceback" in value:
        # A run's error in a table: type and message; `-o json` (or the report) has it all.
        value = {k: v for k, v in value.items() if k != "traceback"}
    if isinstance(value, dict | list):
        return printable(stdjson.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return printable(str(value))


def _console() -> Any:
    from rich.console import Console

    # Piped output is not cut at 80 columns: ids must survive `| grep` and `| awk`.
    return Console(width=None if sys.stdout.isatty() else 240, soft_wrap=False)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], title: str = "") -> None:
    """A rich table of ``rows`` with ``columns``; cells are plain text, never markup."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title or None, show_lines=False, header_style="bold")
    for name in columns:
        table.add_column(name, overflow="fold", no_wrap=name.endswith("_id"))
    for row in rows:
        table.add_row(*(Text(_cell(row.get(name))) for name in columns))
    _console().print(table)


def print_record(data: dict[str, Any], title: str = "") -> None:
    """One object as a two-column (field, value) table."""
    print_table([{"field": k, "value": v} for k, v in data.items()], ["field", "value"], title)


def emit(
    data: Any,
    output: Output,
    *,
    columns: Sequence[str] | None = None,
    title: str = "",
) -> None:
    """Print an API answer as ``output``.

    Args:
        data: a model, a dict, or a page (``items`` + ``next_page_token``).
        output: ``json`` prints the answer as the API sent it; ``table`` prints a page's
            ``items`` as rows of ``columns`` (or one object as field/value rows).
        columns: the columns of a page's rows.
        title: the table's title.
    """
    plain = _jsonable(data)
    if output is Output.JSON:
        print_json(plain)
        return
    if isinstance(plain, dict) and columns is not None and isinstance(plain.get("items"), list):
        print_table(plain["items"], columns, title)
        if not plain["items"]:
            note("(none)")
        return
    if isinstance(plain, list) and columns is not None:
        print_table(plain, columns, title)
        return
    if isinstance(plain, dict):
        print_record(plain, title)
        return
    typer.echo(_cell(plain))  # _cell escapes what a terminal cannot show


def emit_page(page: dict[str, Any], output: Output, *, columns: Sequence[str]) -> None:
    """Print one page of a list (``items`` + ``next_page_token``) as ``output``.

    As :func:`emit`, plus, in a table, a hint on stderr with the ``--page-token`` that
    continues the list (JSON has ``next_page_token`` in it already).
    """
    emit(page, output, columns=columns)
    token = page.get("next_page_token")
    if token and output is Output.TABLE:
        note(f"more: --page-token {token}")
