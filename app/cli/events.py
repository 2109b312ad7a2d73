"""``treadle events``: post an event (triggers and waits) and show one (docs/clients.md)."""

from __future__ import annotations

from typing import Annotated

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

events_app = typer.Typer(
    help="Posted events (POST /events): start triggered workflows, resume waiting runs.",
    no_args_is_help=True,
)


@events_app.command("post")
def events_post(
    name: Annotated[str, typer.Argument(help="Event name, e.g. order.paid")],
    data: Annotated[
        str | None, typer.Option("--data", help="JSON data, or @file.json (default {})")
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", help="Idempotency key: a retry with it starts nothing more"),
    ] = None,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """Post an event; prints it with the runs it started and resumed (scope events:write)."""
    payload = read_json_option(data, "--data")
    with api_client(url, tok) as c:
        emit(c.post_event(name, payload, key=key), output)


@events_app.command("show")
def events_show(
    event_id: str, output: OUTPUT = Output.TABLE, url: URL = DEFAULT_URL, tok: TOKEN = None
) -> None:
    """Show one posted event and the runs it started and resumed."""
    with api_client(url, tok) as c:
        emit(c.get_event(event_id), output)
