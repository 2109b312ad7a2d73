"""The ``treadle`` command (typer): processes, migrations, tokens and run operations."""

from __future__ import annotations

import asyncio
import json as stdjson
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import quote

import httpx
import typer

from app.core.settings import Settings, format_settings_error

app = typer.Typer(help="Treadle: durable workflows as a service.", no_args_is_help=True)
runs_app = typer.Typer(help="Operate on runs through the HTTP API.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
dlq_app = typer.Typer(help="Dead letters: list and requeue.", no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")

EXAMPLE_HANDLERS = ["examples.orders", "examples.onboarding"]


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment; exit 2 with the variable named when invalid."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except Exception as exc:  # noqa: BLE001 - pydantic ValidationError, shown per variable
        _fail("invalid settings:\n" + format_settings_error(exc))


def _run(coro: Coroutine[Any, Any, None]) -> None:
    from app.core.errors import SchemaVersionMismatch

    try:
        asyncio.run(coro)
    except SchemaVersionMismatch as exc:
        _fail(f"refusing to start: {exc.detail}")
    except OSError as exc:
        _fail(f"cannot reach the database: {exc}")
    except KeyboardInterrupt:
        pass


async def _require_schema(settings: Settings) -> None:
    from app.db.database import Database
    from app.db.migrations import check_schema

    db = Database(settings)
    try:
        await check_schema(db)
    finally:
        await db.dispose()


@app.command()
def migrate() -> None:
    """Upgrade the database schema to this code's head (safe to run concurrently)."""
    from app.db.migrations import head_revision, upgrade_to_head

    settings = load_settings()
    upgrade_to_head(settings.database_url)
    typer.echo(f"database at revision {head_revision()}")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address")] = None,
    port: Annotated[int | None, typer.Option(help="Port")] = None,
) -> None:
    """Run the HTTP API (uvicorn). Refuses to start unless the schema is at head."""
    import uvicorn

    from app.api.app import create_app
    from app.core.logging import configure_logging

    settings = load_settings(host=host, port=port)
    configure_logging(settings)
    _run(_require_schema(settings))  # a clear one-line refusal instead of a lifespan traceback
    api = create_app(settings)
    uvicorn.run(
        api,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        # Long-polls may wait minutes: on SIGTERM give them 5 s, then close (clients retry).
        timeout_graceful_shutdown=5,
        # httptools buffers headers without a limit (a 20 MB header was accepted); h11
        # refuses a request line plus headers over this size with 400 before the app runs.
        http="h11",
        h11_max_incomplete_event_size=settings.max_header_bytes,
    )


@app.command()
def worker(
    handlers: Annotated[list[str], typer.Option("--handlers", help="Module(s) with @workflow")],
    concurrency: Annotated[int | None, typer.Option(help="Runs executed at once")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve this worker's Prometheus metrics on this port")
    ] = None,
) -> None:
    """Run a worker executing the workflows defined in ``--handlers`` modules."""
    from app.core.logging import configure_logging
    from app.worker.worker import run_worker

    settings = load_settings()
    configure_logging(settings)
    sys.path.insert(0, os.getcwd())
    _run(run_worker(settings, handlers, concurrency, metrics_port))


@app.command()
def dev(
    port: Annotated[int | None, typer.Option(help="Port")] = None,
    handlers: Annotated[list[str] | None, typer.Option("--handlers")] = None,
) -> None:
    """API + an in-process worker on the embedded SQLite database, examples loaded."""
    from app.cli.dev import run_dev

    settings = load_settings(port=port)
    sys.path.insert(0, os.getcwd())
    _run(run_dev(settings, handlers or EXAMPLE_HANDLERS))


@app.command()
def token(
    tenant: Annotated[str, typer.Option(help="Tenant id")] = "default",
    subject: Annotated[str, typer.Option(help="Subject (who)")] = "dev",
    scopes: Annotated[str, typer.Option(help="Space- or comma-separated scopes")] = (
        "runs:write runs:read runs:cancel approvals:write signals:write"
    ),
    groups: Annotated[
        str, typer.Option(help="Space- or comma-separated groups (approvals may need one)")
    ] = "",
    ttl: Annotated[int, typer.Option(help="Lifetime in seconds")] = 86_400,
) -> None:
    """Print a dev-mode token (HS256, signed with the local dev secret)."""
    from app.auth.dev import DevTokens, dev_secret

    if ttl <= 0:
        _fail("--ttl must be a positive number of seconds")
    if not subject.strip():
        _fail("--subject must not be empty")
    settings = load_settings()
    try:
        minted = DevTokens(dev_secret(settings)).mint(
            tenant_id=tenant,
            subject=subject,
            scopes=scopes.replace(",", " ").split(),
            groups=groups.replace(",", " ").split(),
            ttl_seconds=ttl,
        )
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(minted)


# --- operator commands over HTTP -------------------------------------------------------

URL = Annotated[str, typer.Option(envvar="TREADLE_URL", help="API base URL")]
TOKEN = Annotated[str | None, typer.Option("--token", envvar="TREADLE_TOKEN", help="Bearer token")]


def _client(url: str, tok: str | None) -> httpx.Client:
    if not tok:
        _fail("no token: pass --token or set TREADLE_TOKEN (dev: `treadle token`)")
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tok}"}, timeout=330)


def _show(resp: httpx.Response) -> None:
    """Print a response (JSON pretty, text as is); exit 1 on an error status."""
    if resp.headers.get("content-type", "").startswith("text/plain"):
        typer.echo(resp.text, nl=False)
    else:
        typer.echo(stdjson.dumps(resp.json(), indent=2, ensure_ascii=False))
    if resp.status_code >= 400:
        raise typer.Exit(1)


@runs_app.command("start")
def runs_start(
    workflow: str,
    input_json: Annotated[str, typer.Option("--input", help="JSON input or @file.json")] = "{}",
    key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
    version: Annotated[str | None, typer.Option()] = None,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """Submit a run."""
    try:
        text = Path(input_json[1:]).read_text() if input_json.startswith("@") else input_json
    except OSError as exc:
        _fail(f"--input: cannot read {input_json[1:]!r}: {exc.strerror}")
    try:
        payload = stdjson.loads(text)
    except ValueError as exc:
        _fail(f"--input is not valid JSON: {exc}")
    body: dict[str, Any] = {"workflow": workflow, "input": payload}
    if key:
        body["idempotency_key"] = key
    if version:
        body["version"] = version
    with _client(url, tok) as c:
        _show(c.post("/runs", json=body))


@runs_app.command("get")
def runs_get(run_id: str, url: URL = "http://127.0.0.1:8000", tok: TOKEN = None) -> None:
    """Show one run."""
    with _client(url, tok) as c:
        _show(c.get(f"/runs/{run_id}"))


@runs_app.command("list")
def runs_list(
    workflow: Annotated[str | None, typer.Option()] = None,
    status: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option()] = 20,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """List runs, newest first."""
    params: dict[str, Any] = {"limit": limit}
    if workflow:
        params["workflow"] = workflow
    if status:
        params["status"] = status
    with _client(url, tok) as c:
        _show(c.get("/runs", params=params))


@runs_app.command("report")
def runs_report(
    run_id: str,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """Print the operator's report (text; --json for JSON)."""
    with _client(url, tok) as c:
        _show(c.get(f"/runs/{run_id}/report", params={"format": "json" if as_json else "text"}))


@runs_app.command("cancel")
def runs_cancel(
    run_id: str,
    reason: Annotated[str | None, typer.Option()] = None,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """Cancel a run."""
    with _client(url, tok) as c:
        _show(c.post(f"/runs/{run_id}/cancel", json={"reason": reason} if reason else None))


@runs_app.command("result")
def runs_result(
    run_id: str,
    wait: Annotated[float, typer.Option(help="Seconds to wait")] = 30,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """Wait for and print a run's result."""
    with _client(url, tok) as c:
        _show(c.get(f"/runs/{run_id}/result", params={"wait": wait}))


def _json_option(text: str | None) -> Any:
    if text is None:
        return None
    try:
        raw = Path(text[1:]).read_text() if text.startswith("@") else text
    except OSError as exc:
        _fail(f"--payload: cannot read {text[1:]!r}: {exc.strerror}")
    try:
        return stdjson.loads(raw)
    except ValueError as exc:
        _fail(f"--payload is not valid JSON: {exc}")


@runs_app.command("signal")
def runs_signal(
    run_id: str,
    name: str,
    payload: Annotated[str | None, typer.Option(help="JSON payload or @file.json")] = None,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """Send a signal to a run."""
    with _client(url, tok) as c:
        _show(
            c.post(
                f"/runs/{quote(run_id, safe='')}/signals/{quote(name, safe='')}",
                json={"payload": _json_option(payload)},
            )
        )


@runs_app.command("approve")
def runs_approve(
    run_id: str,
    step: str,
    reject: Annotated[bool, typer.Option("--reject", help="Reject instead")] = False,
    comment: Annotated[str | None, typer.Option()] = None,
    payload: Annotated[str | None, typer.Option(help="JSON payload or @file.json")] = None,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """Approve (or --reject) a run's waiting approval."""
    body = {
        "decision": "reject" if reject else "approve",
        "comment": comment,
        "payload": _json_option(payload),
    }
    with _client(url, tok) as c:
        _show(c.post(f"/runs/{quote(run_id, safe='')}/approvals/{quote(step, safe='')}", json=body))


@runs_app.command("resume")
def runs_resume(run_id: str, url: URL = "http://127.0.0.1:8000", tok: TOKEN = None) -> None:
    """Make a waiting run due now."""
    with _client(url, tok) as c:
        _show(c.post(f"/runs/{run_id}/resume"))


@runs_app.command("retry")
def runs_retry(
    run_id: str,
    reason: Annotated[str, typer.Option(help="Why (audited)")],
    correlation_id: Annotated[str | None, typer.Option()] = None,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """Re-run a failed run from its failed point."""
    body = {"reason": reason, "correlation_id": correlation_id}
    with _client(url, tok) as c:
        _show(c.post(f"/runs/{run_id}/retry", json=body))


@dlq_app.command("list")
def dlq_list(
    all_: Annotated[bool, typer.Option("--all", help="Include requeued ones")] = False,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """List dead letters (pending by default)."""
    with _client(url, tok) as c:
        _show(c.get("/dead-letters", params={"status": "all" if all_ else "pending"}))


@dlq_app.command("requeue")
def dlq_requeue(
    dead_letter_id: str,
    reason: Annotated[str, typer.Option(help="Why (audited)")],
    correlation_id: Annotated[str | None, typer.Option()] = None,
    url: URL = "http://127.0.0.1:8000",
    tok: TOKEN = None,
) -> None:
    """Requeue a dead letter: the run re-runs from its failed point."""
    body = {"reason": reason, "correlation_id": correlation_id}
    with _client(url, tok) as c:
        _show(c.post(f"/dead-letters/{dead_letter_id}/requeue", json=body))


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except httpx.ConnectError as exc:
        _fail_plain(f"cannot reach the API: {exc} (is `treadle serve` running? TREADLE_URL?)")
    except httpx.HTTPError as exc:
        _fail_plain(f"HTTP error talking to the API: {exc}")


def _fail_plain(message: str) -> NoReturn:
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise SystemExit(2)


if __name__ == "__main__":
    main()
