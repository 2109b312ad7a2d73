"""``treadle schedules …``: manage schedules through the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

schedules_app = typer.Typer(help="Cron and one-off schedules (over the HTTP API).")

_URL = Annotated[str, typer.Option(envvar="TREADLE_URL", help="API base URL")]
_TOKEN = Annotated[str | None, typer.Option("--token", envvar="TREADLE_TOKEN", help="Bearer token")]
_DEFAULT_URL = "http://127.0.0.1:8000"


def _path(schedule_id: str, suffix: str = "") -> str:
    return f"/schedules/{quote(schedule_id, safe='')}{suffix}"


def _call(method: str, path: str, url: str, tok: str | None, **kwargs: Any) -> None:
    # Imported here: app.cli.main imports this module to register the command group.
    from app.cli.main import _client, _show

    with _client(url, tok) as c:
        _show(c.request(method, path, **kwargs))


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
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """Create a schedule (give --cron or --at)."""
    from app.cli.main import _json_option

    body: dict[str, Any] = {
        "name": name,
        "workflow": workflow,
        "input": _json_option(input_json),
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
    _call("POST", "/schedules", url, tok, json=body)


@schedules_app.command("list")
def list_(
    workflow: Annotated[str | None, typer.Option()] = None,
    state: Annotated[str | None, typer.Option(help="active | paused | completed")] = None,
    limit: Annotated[int, typer.Option()] = 50,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """List schedules, newest first."""
    params: dict[str, Any] = {"limit": limit}
    if workflow:
        params["workflow"] = workflow
    if state:
        params["state"] = state
    _call("GET", "/schedules", url, tok, params=params)


@schedules_app.command("get")
def get(
    schedule_id: str,
    next_: Annotated[int, typer.Option("--next", help="Upcoming ticks to show")] = 5,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """Show a schedule and its next fire times."""
    _call("GET", _path(schedule_id), url, tok, params={"next": next_})


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
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """Change a schedule (only the options given)."""
    from app.cli.main import _json_option

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
        body["input"] = _json_option(input_json)
    _call("PATCH", _path(schedule_id), url, tok, json=body)


@schedules_app.command("delete")
def delete(schedule_id: str, url: _URL = _DEFAULT_URL, tok: _TOKEN = None) -> None:
    """Delete a schedule (its runs are kept)."""
    from app.cli.main import _client

    with _client(url, tok) as c:
        resp = c.delete(_path(schedule_id))
    if resp.status_code >= 400:
        from app.cli.main import _show

        _show(resp)
    typer.echo(f"deleted {schedule_id}")


@schedules_app.command("pause")
def pause(schedule_id: str, url: _URL = _DEFAULT_URL, tok: _TOKEN = None) -> None:
    """Stop firing."""
    _call("POST", _path(schedule_id, "/pause"), url, tok)


@schedules_app.command("resume")
def resume(schedule_id: str, url: _URL = _DEFAULT_URL, tok: _TOKEN = None) -> None:
    """Fire again from the next tick after now."""
    _call("POST", _path(schedule_id, "/resume"), url, tok)


@schedules_app.command("trigger")
def trigger(schedule_id: str, url: _URL = _DEFAULT_URL, tok: _TOKEN = None) -> None:
    """Fire once now (under the overlap policy)."""
    _call("POST", _path(schedule_id, "/trigger"), url, tok)


@schedules_app.command("fires")
def fires(
    schedule_id: str,
    limit: Annotated[int, typer.Option()] = 20,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """List fired ticks (newest first) with their run ids."""
    _call("GET", _path(schedule_id, "/fires"), url, tok, params={"limit": limit})
