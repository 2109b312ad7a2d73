"""``treadle schedules …``: manage schedules through the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.cli.common import (
    DEFAULT_URL,
    OUTPUT,
    TOKEN,
    URL,
    Output,
    api_client,
    emit,
    read_json_option,
)

schedules_app = typer.Typer(help="Cron and one-off schedules (over the HTTP API).")

_URL = URL
_TOKEN = TOKEN
_DEFAULT_URL = DEFAULT_URL
SCHEDULE_COLUMNS = ["schedule_id", "name", "workflow", "state", "cron", "at", "fired_count"]
FIRE_COLUMNS = ["tick", "kind", "run_id", "fired_at", "outcome"]


def _path(schedule_id: str, suffix: str = "") -> str:
    from app.client import quote_segment  # where used (app.cli.common says why)

    return f"/schedules/{quote_segment(schedule_id)}{suffix}"


def _call(
    method: str,
    path: str,
    url: str,
    tok: str | None,
    output: Output = Output.TABLE,
    columns: list[str] | None = None,
    **kwargs: Any,
) -> None:
    with api_client(url, tok) as c:
        answer = c.request(method, path, **kwargs)
    emit(answer, output, columns=columns)


@schedules_app.command("create")
def create(
    name: str,
    workflow: str,
    cron: Annotated[str | None, typer.Option(help="5-field cron, e.g. '0 2 * * *'")] = None,
    at: Annotated[str | None, typer.Option(help="One-off time, ISO 8601 with offset")] = None,
    timezone: Annotated[str, typer.Option("--tz", help="IANA zone of --cron")] = "UTC",
    input_json: Annotated[str, typer.Option("--input", help="JSON input or @file.json")] = "{}",
    overlap: Annotated[
        str, typer.Option(help="skip | buffer_one | allow_all | cancel_previous")
    ] = "skip",
    catchup_window: Annotated[int, typer.Option(help="Seconds; older ticks are skipped")] = 60,
    jitter: Annotated[int, typer.Option(help="Seconds of deterministic delay per tick")] = 0,
    version: Annotated[str | None, typer.Option()] = None,
    paused: Annotated[bool, typer.Option("--paused")] = False,
    output: OUTPUT = Output.TABLE,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """Create a schedule (give --cron or --at)."""
    body: dict[str, Any] = {
        "name": name,
        "workflow": workflow,
        "input": read_json_option(input_json, "--input"),
        "timezone": timezone,
        "overlap": overlap,
        "catchup_window_seconds": catchup_window,
        "jitter_seconds": jitter,
        "paused": paused,
    }
    if cron is not None:
        body["cron"] = cron
    if at is not None:
        body["at"] = at
    if version is not None:
        body["version"] = version
    _call("POST", "/schedules", url, tok, output, json=body)


@schedules_app.command("list")
def list_(
    workflow: Annotated[str | None, typer.Option()] = None,
    state: Annotated[str | None, typer.Option(help="active | paused | completed")] = None,
    limit: Annotated[int, typer.Option()] = 50,
    output: OUTPUT = Output.TABLE,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """List schedules, newest first."""
    params: dict[str, Any] = {"limit": limit}
    if workflow:
        params["workflow"] = workflow
    if state:
        params["state"] = state
    _call("GET", "/schedules", url, tok, output, SCHEDULE_COLUMNS, params=params)


@schedules_app.command("get")
def get(
    schedule_id: str,
    next_: Annotated[int, typer.Option("--next", help="Upcoming ticks to show")] = 5,
    output: OUTPUT = Output.TABLE,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """Show a schedule and its next fire times."""
    _call("GET", _path(schedule_id), url, tok, output, params={"next": next_})


@schedules_app.command("update")
def update(
    schedule_id: str,
    cron: Annotated[str | None, typer.Option()] = None,
    at: Annotated[str | None, typer.Option()] = None,
    timezone: Annotated[str | None, typer.Option("--tz")] = None,
    input_json: Annotated[str | None, typer.Option("--input")] = None,
    overlap: Annotated[str | None, typer.Option()] = None,
    catchup_window: Annotated[int | None, typer.Option()] = None,
    jitter: Annotated[int | None, typer.Option()] = None,
    output: OUTPUT = Output.TABLE,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """Change a schedule (only the options given)."""
    body: dict[str, Any] = {}
    for key, value in (
        ("cron", cron),
        ("at", at),
        ("timezone", timezone),
        ("overlap", overlap),
        ("catchup_window_seconds", catchup_window),
        ("jitter_seconds", jitter),
    ):
        if value is not None:
            body[key] = value
    if input_json is not None:
        body["input"] = read_json_option(input_json, "--input")
    _call("PATCH", _path(schedule_id), url, tok, output, json=body)


@schedules_app.command("delete")
def delete(schedule_id: str, url: _URL = _DEFAULT_URL, tok: _TOKEN = None) -> None:
    """Delete a schedule (its runs are kept)."""
    with api_client(url, tok) as c:
        c.request("DELETE", _path(schedule_id))
    typer.echo(f"deleted {schedule_id}")


@schedules_app.command("pause")
def pause(
    schedule_id: str, output: OUTPUT = Output.TABLE, url: _URL = _DEFAULT_URL, tok: _TOKEN = None
) -> None:
    """Stop firing."""
    _call("POST", _path(schedule_id, "/pause"), url, tok, output)


@schedules_app.command("resume")
def resume(
    schedule_id: str, output: OUTPUT = Output.TABLE, url: _URL = _DEFAULT_URL, tok: _TOKEN = None
) -> None:
    """Fire again from the next tick after now."""
    _call("POST", _path(schedule_id, "/resume"), url, tok, output)


@schedules_app.command("trigger")
def trigger(
    schedule_id: str, output: OUTPUT = Output.TABLE, url: _URL = _DEFAULT_URL, tok: _TOKEN = None
) -> None:
    """Fire once now (under the overlap policy)."""
    _call("POST", _path(schedule_id, "/trigger"), url, tok, output)


@schedules_app.command("fires")
def fires(
    schedule_id: str,
    limit: Annotated[int, typer.Option()] = 20,
    output: OUTPUT = Output.TABLE,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """List fired ticks (newest first) with their run ids."""
    _call(
        "GET", _path(schedule_id, "/fires"), url, tok, output, FIRE_COLUMNS, params={"limit": limit}
    )
