"""``treadle webhooks …``: outbound webhook endpoints and their delivery logs (HTTP API).

docs/api.md "Webhooks"; needs a token with the ``webhooks:manage`` scope.
"""

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
    emit_page,
    note,
)

webhooks_app = typer.Typer(help="Outbound webhooks on run terminal states (over the HTTP API).")

_URL = URL
_TOKEN = TOKEN
_DEFAULT_URL = DEFAULT_URL
WEBHOOK_COLUMNS = ["webhook_id", "url", "events", "workflow", "created_at"]
DELIVERY_COLUMNS = [
    "delivery_id",
    "run_id",
    "run_status",
    "state",
    "attempts",
    "last_result",
    "next_attempt_at",
]


@webhooks_app.command("add")
def add(
    target: Annotated[str, typer.Argument(metavar="URL", help="http(s) URL to POST to")],
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event", help="completed | failed | cancelled | compensated (repeat; default all)"
        ),
    ] = None,
    workflow: Annotated[str | None, typer.Option(help="Only runs of this workflow")] = None,
    output: OUTPUT = Output.TABLE,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """Register an endpoint; prints its signing secret, shown this once."""
    with api_client(url, tok) as c:
        created = c.create_webhook(target, events=event or None, workflow=workflow)
    emit(created, output)
    if output is Output.TABLE:
        note("store the secret now: it is not shown again")


@webhooks_app.command("list")
def list_(output: OUTPUT = Output.TABLE, url: _URL = _DEFAULT_URL, tok: _TOKEN = None) -> None:
    """The tenant's endpoints."""
    with api_client(url, tok) as c:
        answer = c.webhooks()
    emit(answer, output, columns=WEBHOOK_COLUMNS)


@webhooks_app.command("rm")
def rm(webhook_id: str, url: _URL = _DEFAULT_URL, tok: _TOKEN = None) -> None:
    """Delete an endpoint with its delivery log."""
    with api_client(url, tok) as c:
        c.delete_webhook(webhook_id)
    typer.echo(f"deleted {webhook_id}")


@webhooks_app.command("deliveries")
def deliveries(
    webhook_id: str,
    page_token: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option(min=1, max=200)] = 50,
    output: OUTPUT = Output.TABLE,
    url: _URL = _DEFAULT_URL,
    tok: _TOKEN = None,
) -> None:
    """An endpoint's delivery log, newest first (a table shows each one's last attempt)."""
    with api_client(url, tok) as c:
        page = c.webhook_deliveries(webhook_id, page_token=page_token, limit=limit)
    plain: dict[str, Any] = page.model_dump(mode="json")
    if output is Output.TABLE:
        for item in plain["items"]:
            attempts = item["attempts"]
            last = attempts[-1] if attempts else None
            item["last_result"] = (
                "" if last is None else last["http_status"] or last["error"] or "interrupted"
            )
            item["attempts"] = len(attempts)
    emit_page(plain, output, columns=DELIVERY_COLUMNS)
