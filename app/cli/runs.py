"""``treadle runs …`` and ``treadle dlq …``: operator commands over the HTTP API.

Built on :class:`app.client.TreadleClient` (429/503 retried after ``Retry-After``, ids
URL-quoted, errors as :class:`app.client.TreadleAPIError`); conventions (``-o``, exit
codes) in :mod:`app.cli.common`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.cli.common import (
    DEFAULT_URL,
    OUTPUT,
    TOKEN,
    URL,
    ExitCode,
    Output,
    api_client,
    emit,
    emit_page,
    fail,
    note,
    parse_time,
    print_json,
    read_json_option,
)
from app.core import json
from app.core.errors import InvalidInput
from app.core.json import parse_text
from app.core.text import printable

if TYPE_CHECKING:  # imported where used (app.cli.common says why)
    from app.client import Event, LogLine, RunResult, TreadleClient

runs_app = typer.Typer(help="Operate on runs through the HTTP API.", no_args_is_help=True)
dlq_app = typer.Typer(help="Dead letters: list and requeue.", no_args_is_help=True)

RUN_COLUMNS = ["run_id", "workflow", "version", "status", "reason", "created_at", "finished_at"]
DEAD_LETTER_COLUMNS = [
    "dead_letter_id",
    "run_id",
    "workflow",
    "reason",
    "status",
    "created_at",
    "requeued_by",
]


class ReportOutput(StrEnum):
    """``-o`` of ``treadle runs report``."""

    TEXT = "text"
    JSON = "json"


def _finish(result: RunResult, output: Output) -> None:
    """Print a result; exit 1 unless the run completed (failed, cancelled, still open)."""
    emit(result, output)
    if result.succeeded:
        return
    if not result.done:
        note(f"run {result.run_id} is still {result.status.value}")
    else:
        reason = result.reason.value if result.reason else "no reason"
        note(f"run {result.run_id} ended {result.status.value} ({reason})")
    raise typer.Exit(ExitCode.FAILED)


_INPUT = Annotated[str, typer.Option("--input", help="JSON input or @file.json")]
_KEY = Annotated[str | None, typer.Option("--idempotency-key", help="Makes retries safe")]
_CONCURRENCY_KEY = Annotated[
    str | None,
    typer.Option(
        "--concurrency-key", help="At most key_limit active runs per key (a state machine's parent)"
    ),
]
_VERSION = Annotated[str | None, typer.Option("--version", help="Pin a registered version")]
_LABEL = Annotated[
    list[str] | None,
    typer.Option(
        "--label",
        help="key=value (repeatable); in `runs list` a value ending in * is a prefix",
    ),
]


def _labels(pairs: list[str] | None) -> dict[str, str] | None:
    """``--label key=value`` options as a dict (the server checks the label rules)."""
    labels: dict[str, str] = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq:
            raise typer.BadParameter(f"--label {pair!r}: expected key=value")
        labels[key] = value
    return labels or None


@runs_app.command("start")
def runs_start(
    workflow: str,
    input_json: _INPUT = "{}",
    key: _KEY = None,
    concurrency_key: _CONCURRENCY_KEY = None,
    version: _VERSION = None,
    label: _LABEL = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Submit a run (do not wait; see `runs execute`)."""
    payload = read_json_option(input_json, "--input")
    labels = _labels(label)
    with api_client(url, tok) as c:
        run = c.submit(
            workflow,
            payload,
            version=version,
            idempotency_key=key,
            concurrency_key=concurrency_key,
            labels=labels,
        )
    emit(run, output)


BATCH_COLUMNS = ["index", "status", "run_id", "code", "detail"]


def read_batch_file(path: str) -> list[Any]:
    """The runs of ``submit-batch``'s FILE (``-``: stdin): a JSON array or JSON lines.

    Exits 2 (usage) if the file cannot be read or is neither; each item is sent as it
    is (the server checks each one).
    """
    try:
        raw = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        fail(f"FILE: cannot read {path!r}: {exc.strerror}")
    stripped = raw.strip()
    # Read under the API's JSON rules (a repeated key, NaN, a lone surrogate refused
    # here), so re-encoding an item never turns a body the API refuses into one it takes.
    if stripped.startswith("["):
        try:
            return list(parse_text(stripped, "the array"))
        except InvalidInput as exc:
            fail(f"FILE is neither a JSON array nor JSON lines: {exc.detail}")
    items: list[Any] = []
    for number, line in enumerate(stripped.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            # The file's own line number: each line is parsed alone, so the parser's
            # position is always line 1.
            items.append(parse_text(line, "the line"))
        except InvalidInput as exc:
            fail(f"FILE is neither a JSON array nor JSON lines: line {number}: {exc.detail}")
    return items


@runs_app.command("submit-batch")
def runs_submit_batch(
    file: Annotated[
        str, typer.Argument(help="JSON array or JSON lines of POST /runs bodies; - is stdin")
    ],
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Submit many runs in one request (POST /runs:batch); exit 1 if any item failed."""
    items = read_batch_file(file)
    if not items:
        fail("FILE holds no runs")
    with api_client(url, tok) as c:
        answer = c.submit_batch(items)
    if output is Output.JSON:
        emit(answer, output)
    else:
        rows = [
            {
                "index": r.index,
                "status": r.status,
                "run_id": None if r.run is None else r.run.run_id,
                "code": None if r.problem is None else r.problem.get("code"),
                "detail": None if r.problem is None else r.problem.get("detail"),
            }
            for r in answer.results
        ]
        emit(rows, output, columns=BATCH_COLUMNS)
        note(f"{answer.created} created, {answer.failed} failed of {len(answer.results)}")
    if answer.failed:
        raise typer.Exit(ExitCode.FAILED)


@runs_app.command("execute")
def runs_execute(
    workflow: str,
    input_json: _INPUT = "{}",
    key: _KEY = None,
    concurrency_key: _CONCURRENCY_KEY = None,
    version: _VERSION = None,
    timeout: Annotated[
        float | None, typer.Option(help="Give up waiting after this many seconds")
    ] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Submit a run and wait for its result: exit 0 if it completed, 1 if not."""
    from app.client import RunNotFinished

    payload = read_json_option(input_json, "--input")
    with api_client(url, tok) as c:
        run = c.submit(
            workflow,
            payload,
            version=version,
            idempotency_key=key,
            concurrency_key=concurrency_key,
        )
        note(f"run {run.run_id} submitted ({run.status.value}); waiting for its result")
        try:
            result = c.wait(run.run_id, timeout=timeout, check=False)
        except RunNotFinished as exc:
            result = exc.result
    _finish(result, output)


@runs_app.command("get")
def runs_get(
    run_id: str, output: OUTPUT = Output.TABLE, url: URL = DEFAULT_URL, tok: TOKEN = None
) -> None:
    """Show one run."""
    with api_client(url, tok) as c:
        emit(c.get(run_id), output)


@runs_app.command("list")
def runs_list(
    workflow: Annotated[str | None, typer.Option(help="Only this workflow")] = None,
    status: Annotated[str | None, typer.Option(help="Only this status (queued, failed, …)")] = None,
    created_after: Annotated[
        str | None, typer.Option(help="ISO 8601 date/time; without an offset, UTC")
    ] = None,
    created_before: Annotated[
        str | None, typer.Option(help="ISO 8601 date/time; without an offset, UTC")
    ] = None,
    page_token: Annotated[
        str | None, typer.Option(help="Continue from a previous page (same filters)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=200, help="Runs per page")] = 20,
    all_pages: Annotated[bool, typer.Option("--all", help="Every page, not just one")] = False,
    label: _LABEL = None,
    reason: Annotated[str | None, typer.Option(help="Only runs that ended this way")] = None,
    version: Annotated[str | None, typer.Option(help="Only this definition version")] = None,
    waiting_on: Annotated[
        str | None, typer.Option(help="kind or kind:name, e.g. signal:payment")
    ] = None,
    finished_after: Annotated[
        str | None, typer.Option(help="ISO 8601 date/time; without an offset, UTC")
    ] = None,
    finished_before: Annotated[
        str | None, typer.Option(help="ISO 8601 date/time; without an offset, UTC")
    ] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """List runs, newest first (one page; --all for every page)."""
    after = parse_time(created_after, "--created-after")
    before = parse_time(created_before, "--created-before")
    more: dict[str, Any] = {
        "reason": reason,
        "version": version,
        "waiting_on": waiting_on,
        "finished_after": parse_time(finished_after, "--finished-after"),
        "finished_before": parse_time(finished_before, "--finished-before"),
        "labels": _labels(label),
    }
    with api_client(url, tok) as c:
        if all_pages:
            items: list[Any] = []
            token: str | None = None
            while True:
                got = c.list(
                    workflow=workflow,
                    status=status,
                    created_after=after,
                    created_before=before,
                    page_token=token,
                    limit=200,
                    **more,
                )
                items.extend(got.items)
                token = got.next_page_token
                if token is None:
                    break
            page: dict[str, Any] = {"items": items, "next_page_token": None}
            if page_token:
                note("--page-token is ignored with --all")
        else:
            page = c.list(
                workflow=workflow,
                status=status,
                created_after=after,
                created_before=before,
                page_token=page_token,
                limit=limit,
                **more,
            ).model_dump(mode="json")
    emit_page(page, output, columns=RUN_COLUMNS)


@runs_app.command("report")
def runs_report(
    run_id: str,
    output: Annotated[
        ReportOutput,
        typer.Option("--output", "-o", help="text (default) or json", case_sensitive=False),
    ] = ReportOutput.TEXT,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Print the operator's report: run, steps, timeline, last log lines, dead letters."""
    with api_client(url, tok) as c:
        if output is ReportOutput.JSON:
            print_json(c.report(run_id))
        else:
            typer.echo(printable(c.report_text(run_id), keep="\n"), nl=False)


def _log_text(line: LogLine) -> str:
    where = f" [{line.step_id}#{line.attempt}]" if line.step_id is not None else ""
    if line.message is None:
        return f"{line.at.isoformat()}  {line.level:<8}{where} (message withheld: run redacted)"
    fields = f" {json.dumps(line.fields)}" if line.fields else ""
    return f"{line.at.isoformat()}  {line.level:<8}{where} {line.message}{fields}"


@runs_app.command("logs")
def runs_logs(
    run_id: str,
    level: Annotated[
        str | None, typer.Option(help="Only this severity or higher (debug, info, warning, error)")
    ] = None,
    step: Annotated[str | None, typer.Option(help="Only this step's attempts (a step id)")] = None,
    page_token: Annotated[
        str | None, typer.Option(help="Continue from a previous page (same filters)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Lines per page")] = 200,
    all_pages: Annotated[bool, typer.Option("--all", help="Every page, not just one")] = False,
    output: Annotated[
        ReportOutput,
        typer.Option("--output", "-o", help="text (default) or json", case_sensitive=False),
    ] = ReportOutput.TEXT,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Print the lines the run's handler code logged with ctx.logger, oldest first."""
    items: list[LogLine] = []
    with api_client(url, tok) as c:
        token = page_token
        while True:
            page = c.logs(run_id, level=level, step=step, page_token=token, limit=limit)
            items.extend(page.items)
            token = page.next_page_token
            if token is None or not all_pages:
                break
    if output is ReportOutput.JSON:
        print_json({"items": [i.model_dump(mode="json") for i in items], "next_page_token": token})
        return
    for line in items:
        # One line each: a message holding a line break or ESC cannot forge another.
        typer.echo(printable(_log_text(line)))
    if not items:
        note("(none)")
    if token is not None:
        note(f"more: --page-token {token}")


def _event_text(event: Event) -> str:
    where = f" [{event.step_id}]" if event.step_id is not None else ""
    data = "" if event.data is None else f" {json.dumps(event.data)}"
    return f"{event.event_id}  {event.at.isoformat()}  {event.kind}{where}{data}"


@runs_app.command("events")
def runs_events(
    run_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream events live until the run ends")
    ] = False,
    after: Annotated[
        int | None, typer.Option(min=0, help="Only events after this event id")
    ] = None,
    output: Annotated[
        ReportOutput,
        typer.Option(
            "--output",
            "-o",
            help="text (default) or json (one object a line)",
            case_sensitive=False,
        ),
    ] = ReportOutput.TEXT,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Print the run's timeline, one line per event, oldest first.

    With --follow, print events as they happen (GET /runs/{id}/events?follow=true,
    resumed after a dropped connection) and exit once the run is terminal.
    """
    with api_client(url, tok) as c:
        events: Iterator[Event] = (
            c.follow_events(run_id, after=after) if follow else _all_events(c, run_id, after)
        )
        for event in events:
            if output is ReportOutput.JSON:
                typer.echo(json.dumps(event.model_dump(mode="json")))
            else:
                # One line each: data holding a line break or ESC cannot forge another.
                typer.echo(printable(_event_text(event)))


def _all_events(c: TreadleClient, run_id: str, after: int | None) -> Iterator[Event]:
    token: str | None = None
    while True:
        page = c.events(run_id, page_token=token, limit=500)
        yield from (e for e in page.items if after is None or e.event_id > after)
        token = page.next_page_token
        if token is None:
            return


@runs_app.command("cancel")
def runs_cancel(
    run_id: str,
    reason: Annotated[str | None, typer.Option(help="Why (audited)")] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Cancel a run."""
    with api_client(url, tok) as c:
        emit(c.cancel(run_id, reason=reason), output)


@runs_app.command("result")
def runs_result(
    run_id: str,
    wait: Annotated[float, typer.Option(min=0, max=300, help="Seconds to wait")] = 30,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Wait for and print a run's result: exit 0 if it completed, 1 if it failed or is open."""
    with api_client(url, tok) as c:
        result = c.result(run_id, wait=wait)
    _finish(result, output)


@runs_app.command("signal")
def runs_signal(
    run_id: str,
    name: str,
    payload: Annotated[str | None, typer.Option(help="JSON payload or @file.json")] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Send a signal to a run."""
    body = read_json_option(payload, "--payload")
    with api_client(url, tok) as c:
        emit(c.signal(run_id, name, body), output)


@runs_app.command("approve")
def runs_approve(
    run_id: str,
    step: str,
    reject: Annotated[bool, typer.Option("--reject", help="Reject instead")] = False,
    comment: Annotated[str | None, typer.Option()] = None,
    payload: Annotated[str | None, typer.Option(help="JSON payload or @file.json")] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Approve (or --reject) a run's waiting approval."""
    body = read_json_option(payload, "--payload")
    with api_client(url, tok) as c:
        decide = c.reject if reject else c.approve
        emit(decide(run_id, step, payload=body, comment=comment), output)


@runs_app.command("resume")
def runs_resume(
    run_id: str, output: OUTPUT = Output.TABLE, url: URL = DEFAULT_URL, tok: TOKEN = None
) -> None:
    """Make a waiting run due now."""
    with api_client(url, tok) as c:
        emit(c.resume(run_id), output)


@runs_app.command("pause")
def runs_pause(
    run_id: str,
    reason: Annotated[str | None, typer.Option(help="Why (shown on the run)")] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Pause a run: it finishes its current step attempt and takes no new step."""
    with api_client(url, tok) as c:
        emit(c.pause(run_id, reason=reason), output)


@runs_app.command("unpause")
def runs_unpause(
    run_id: str, output: OUTPUT = Output.TABLE, url: URL = DEFAULT_URL, tok: TOKEN = None
) -> None:
    """Unpause a paused run; what fell due while it was paused runs now."""
    with api_client(url, tok) as c:
        emit(c.unpause(run_id), output)


@runs_app.command("rerun")
def runs_rerun(
    run_id: str,
    from_step: Annotated[str, typer.Option("--from-step", help="Journaled step id to rerun from")],
    idempotency_key: Annotated[str | None, typer.Option(help="Same key, same rerun")] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Start a new run of a finished run's version and input from one of its steps."""
    with api_client(url, tok) as c:
        emit(c.rerun(run_id, from_step, idempotency_key=idempotency_key), output)


@runs_app.command("retry")
def runs_retry(
    run_id: str,
    reason: Annotated[str, typer.Option(help="Why (audited)")],
    correlation_id: Annotated[str | None, typer.Option()] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Re-run a failed run from its failed point."""
    with api_client(url, tok) as c:
        emit(c.retry(run_id, reason=reason, correlation_id=correlation_id), output)


@dlq_app.command("list")
def dlq_list(
    all_: Annotated[
        bool, typer.Option("--all", help="Every dead letter, requeued ones too, every page")
    ] = False,
    workflow: Annotated[str | None, typer.Option(help="Only this workflow")] = None,
    page_token: Annotated[str | None, typer.Option(help="Continue from a previous page")] = None,
    limit: Annotated[int, typer.Option(min=1, max=200, help="Per page")] = 50,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """List dead letters, newest first (one page of pending ones by default)."""
    with api_client(url, tok) as c:
        if all_:
            items = list(c.dead_letters_all(status="all", workflow=workflow))
            page: dict[str, Any] = {"items": items, "next_page_token": None}
        else:
            page = c.dead_letters(
                status="pending", workflow=workflow, page_token=page_token, limit=limit
            ).model_dump(mode="json")
    emit_page(page, output, columns=DEAD_LETTER_COLUMNS)


@dlq_app.command("requeue")
def dlq_requeue(
    dead_letter_id: str,
    reason: Annotated[str, typer.Option(help="Why (audited)")],
    correlation_id: Annotated[str | None, typer.Option()] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Requeue a dead letter: the run re-runs from its failed point."""
    with api_client(url, tok) as c:
        emit(c.requeue(dead_letter_id, reason=reason, correlation_id=correlation_id), output)
