"""The ``treadle`` command (typer): processes, migrations, tokens and run operations."""

from __future__ import annotations

import asyncio
import json as stdjson
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from app.cli.batches import batches_app
from app.cli.check import check as check_command
from app.cli.common import ExitCode
from app.cli.events import events_app
from app.cli.failures import TreadleGroup
from app.cli.runs import dlq_app, runs_app
from app.cli.schedules import schedules_app
from app.cli.tenants import tenants_app
from app.cli.webhooks import webhooks_app
from app.core.settings import AuthMode, Settings, format_settings_error
from app.core.text import printable
from app.core.version import treadle_version

if TYPE_CHECKING:
    from app.db.database import Database
    from app.engine.api_keys import ApiKeyService

S = TypeVar("S")

app = typer.Typer(
    cls=TreadleGroup, help="Treadle: durable workflows as a service.", no_args_is_help=True
)
app.add_typer(runs_app, name="runs")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"treadle {treadle_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    """Treadle: durable workflows as a service."""


app.add_typer(dlq_app, name="dlq")
app.command("check")(check_command)
keys_app = typer.Typer(
    help="Per-tenant API keys, straight on the database (like `treadle migrate`).",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="api-keys")
maintenance_app = typer.Typer(
    help="Maintenance tiers on the database (like migrate: talks to it directly).",
    no_args_is_help=True,
)
app.add_typer(maintenance_app, name="maintenance")

app.add_typer(schedules_app, name="schedules")
app.add_typer(batches_app, name="batches")
app.add_typer(events_app, name="events")
app.add_typer(tenants_app, name="tenants")
app.add_typer(webhooks_app, name="webhooks")

EXAMPLE_HANDLERS = [
    "examples.orders",
    "examples.onboarding",
    "examples.order_total",
    "examples.nightly_report",
    "examples.document_flow",
    "examples.agent_loop",
]


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(printable(message, keep="\n"), fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment; exit 2 with the variable named when invalid."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except Exception as exc:  # noqa: BLE001 - pydantic ValidationError, shown per variable
        _fail("invalid settings:\n" + format_settings_error(exc))


def _run(coro: Coroutine[Any, Any, None], *, uvloop_if_available: bool = False) -> None:
    """Run ``coro`` to completion; Ctrl-C ends it quietly.

    Its expected failures (the database missing, unreachable or at the wrong revision)
    are :func:`app.cli.failures.explain`'s, raised through to the root group like every
    command's.
    """

    async def settled() -> None:
        from app.db.sqlite import settle_worker_threads

        try:
            await coro
        finally:
            await settle_worker_threads()

    try:
        if uvloop_if_available:
            _run_fast(settled())
        else:
            asyncio.run(settled())
    except KeyboardInterrupt:
        pass


def _run_fast(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on uvloop (libuv, as ``treadle serve`` via uvicorn), else asyncio.

    Socket writes are a worker's largest single cost (two statements per step) and
    uvloop's transports do them in C. uvloop comes with ``uvicorn[standard]`` where it is
    supported (not on Windows): elsewhere the stdlib loop runs the same code.
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        asyncio.run(coro)
        return
    uvloop.run(coro)


async def _require_schema(
    settings: Settings,
    registered: list[str] | None = None,
    *,
    check: Callable[[Database], Awaitable[None]] | None = None,
) -> None:
    """Refuse unless the schema is at head; fill ``registered`` with ``name@version``s.

    ``check`` replaces the "at head" check (``treadle migrate``: known to this code).

    An unreachable database is waited for, with backoff and a warning per attempt, up
    to ``TREADLE_DB_START_TIMEOUT_SECONDS`` (as ``treadle worker`` does:
    :func:`app.db.faults.wait_out_faults`); then ``DatabaseUnreachableAtStart``.
    """
    from app.db.database import Database
    from app.db.faults import wait_out_faults
    from app.db.migrations import check_schema
    from app.db.queries.definitions import list_definitions

    async def attempt() -> None:
        db = Database(settings)
        try:
            await (check or check_schema)(db)
            if registered is not None:
                async with db.read() as conn:
                    rows = await list_definitions(conn)
                registered[:] = [f"{r['name']}@{r['version']}" for r in rows]
        finally:
            await db.dispose()

    # Ctrl-C ends the wait (KeyboardInterrupt, see _run); SIGTERM's default ends the process.
    await wait_out_faults(
        attempt,
        what="schema check",
        stopping=asyncio.Event(),
        give_up_after_seconds=settings.db_start_timeout_seconds,
    )


@app.command()
def migrate() -> None:
    """Upgrade the database schema to this code's head (safe to run concurrently)."""
    from app.db.migrations import check_upgradable, head_revision
    from app.db.migrations import migrate as upgrade

    settings = load_settings()

    async def go() -> None:
        # The database is waited for as at `treadle serve` (a migrate job started beside
        # its database); one that does not exist, refuses the credentials or is ahead of
        # this code is refused at once (app/cli/failures.py).
        await _require_schema(settings, check=check_upgradable)
        await upgrade(settings.database_url)

    _run(go())
    typer.echo(f"database at revision {head_revision()}")


def _starting(role: str, settings: Settings) -> None:
    """Log one early line before the schema check and handler imports.

    Those take seconds on a loaded machine: ``serve`` / ``worker`` never look hung
    before their "ready" line.

    The database URL is redacted (``safe_database_url``: no password). The line goes to
    stdout beside the "ready" line, so a refusal stays the one line on stderr
    (tests/unit/test_handler_import_errors.py).
    """
    from app.cli.ready import safe_database_url

    typer.echo(f"starting {role}: checking database {safe_database_url(settings.database_url)}...")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address")] = None,
    port: Annotated[int | None, typer.Option(help="Port")] = None,
    ssl_certfile: Annotated[
        Path | None,
        typer.Option(help="Serve https with this PEM certificate (TREADLE_SSL_CERTFILE)"),
    ] = None,
    ssl_keyfile: Annotated[
        Path | None,
        typer.Option(help="The certificate's PEM private key (TREADLE_SSL_KEYFILE)"),
    ] = None,
) -> None:
    """Run the HTTP API (uvicorn). Refuses to start unless the schema is at head.

    Outside the embedded SQLite database, refuses to start unless TREADLE_AUTH_MODE is
    set (jwt for production; dev only explicitly, for local testing).
    """
    from app.api.app import create_app
    from app.api.server import server_config
    from app.cli.ready import AnnouncingServer, console_note, serve_line
    from app.core import tracing
    from app.core.logging import configure_logging

    settings = load_settings(
        host=host, port=port, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile
    )
    configure_logging(settings)
    _starting("api", settings)
    # Traces when the OTEL_* variables ask (docs/operations.md#traces), before create_app
    # decides whether to install the request span middleware.
    tracing.setup("treadle-api")
    require_chosen_auth(settings, "serve")
    registered: list[str] = []
    # A clear one-line refusal instead of a lifespan traceback.
    _run(_require_schema(settings, registered))
    api = create_app(settings)
    # Long-polls may wait minutes: on SIGTERM give them 5 s, then close (clients retry).
    config = server_config(api, settings, graceful_shutdown_seconds=5)
    line = serve_line(
        settings.host,
        settings.port,
        settings.database_url,
        registered,
        console_note(settings),
        https=settings.ssl_certfile is not None,
    )
    server = AnnouncingServer(config, line)
    try:
        server.run()
    finally:
        tracing.shutdown()  # export what the batch processor still holds
    if not server.started:  # e.g. the port is taken: uvicorn logged why
        raise typer.Exit(ExitCode.FAILED)


@app.command()
def worker(
    handlers: Annotated[
        list[str],
        typer.Option(
            "--handlers",
            # One list for the worker and its health check (docker-compose.yml).
            envvar="TREADLE_HANDLERS",
            help="Module(s) with @workflow (repeatable; or TREADLE_HANDLERS, space-separated)",
        ),
    ],
    concurrency: Annotated[int | None, typer.Option(help="Runs executed at once")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve this worker's Prometheus metrics on this port")
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Health check, then exit 0/1: database reachable, schema at head, "
            "handlers importable (a container HEALTHCHECK)",
        ),
    ] = False,
) -> None:
    """Run a worker executing the workflows defined in ``--handlers`` modules."""
    from app.cli.ready import worker_line
    from app.core import heap, tracing
    from app.core.logging import configure_logging
    from app.worker.worker import Worker, run_worker

    settings = load_settings()
    sys.path.insert(0, os.getcwd())
    if check:
        from app.cli.worker_check import worker_check

        raise typer.Exit(worker_check(settings, handlers))
    configure_logging(settings)
    _starting("worker", settings)
    tracing.setup("treadle-worker")

    def ready(w: Worker) -> None:
        keys = [f"{n}@{v}" for n, v in w.registry.keys]
        heap.settle()  # started: what is alive now lives as long as the process
        typer.echo(worker_line(w.worker_id, settings.database_url, keys, w.concurrency))

    try:
        _run(
            run_worker(settings, handlers, concurrency, metrics_port, on_ready=ready),
            uvloop_if_available=True,
        )
    finally:
        tracing.shutdown()


def require_local_dev(settings: Settings, command: str) -> None:
    """Refuse dev-mode tokens outside the embedded database unless explicitly asked for.

    Dev tokens are signed with a shared secret and name any tenant, so they are for a
    laptop: allowed on SQLite (the embedded database); on any other database only when
    ``TREADLE_AUTH_MODE=dev`` is set explicitly, and then with a warning (docs/security.md).
    """
    if settings.auth_mode != AuthMode.DEV:
        _fail(f"refusing `treadle {command}`: TREADLE_AUTH_MODE is {settings.auth_mode.value}")
    require_chosen_auth(settings, command)


def require_chosen_auth(settings: Settings, command: str) -> None:
    """Refuse dev auth that nobody chose: outside SQLite it must be explicit.

    The rule is :meth:`Settings.dev_auth_refusal` (also enforced by ``create_app``); an
    explicit ``TREADLE_AUTH_MODE=dev`` on another database starts with a warning.
    """
    from sqlalchemy.engine import make_url

    refusal = settings.dev_auth_refusal()
    if refusal is not None:
        _fail(f"refusing `treadle {command}`: {refusal}")
    if settings.auth_mode == AuthMode.DEV and not settings.is_sqlite:
        import structlog

        where = make_url(settings.database_url).render_as_string(hide_password=True)
        # A log line (the caller configured logging): with TREADLE_LOG_FORMAT=json the
        # process's stderr stays one JSON object per line.
        structlog.get_logger("treadle.auth").warning(
            "dev-mode tokens outside the embedded database: anyone holding the dev secret "
            "can act as any tenant with any scope; for local testing only",
            database=where,
        )


@app.command()
def dev(
    port: Annotated[int | None, typer.Option(help="Port")] = None,
    ssl_certfile: Annotated[
        Path | None,
        typer.Option(help="Serve https with this PEM certificate (TREADLE_SSL_CERTFILE)"),
    ] = None,
    ssl_keyfile: Annotated[
        Path | None,
        typer.Option(help="The certificate's PEM private key (TREADLE_SSL_KEYFILE)"),
    ] = None,
    handlers: Annotated[list[str] | None, typer.Option("--handlers")] = None,
    approver_groups: Annotated[
        list[str] | None,
        typer.Option(
            "--approver-group",
            help="Group of the printed approver token (repeatable; default: the "
            "examples' sales-manager when no --handlers are given)",
        ),
    ] = None,
) -> None:
    """API + an in-process worker on the embedded SQLite database, examples loaded.

    Refused on another database unless TREADLE_AUTH_MODE=dev is set explicitly.
    """
    import importlib.util

    from app.cli.dev import run_dev
    from app.core.logging import configure_logging

    settings = load_settings(port=port, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)
    configure_logging(settings)
    require_local_dev(settings, "dev")
    sys.path.insert(0, os.getcwd())
    if not handlers and importlib.util.find_spec("examples") is None:
        # Installed from the wheel: the examples live in the checkout and the image only.
        _fail(
            "no --handlers given and the examples are not installed (they ship with the "
            "Treadle checkout and image, not the wheel): pass --handlers yourpkg.flows"
        )
    groups = (
        approver_groups if approver_groups is not None else ([] if handlers else ["sales-manager"])
    )
    _run(run_dev(settings, handlers or EXAMPLE_HANDLERS, groups))


@app.command()
def token(
    tenant: Annotated[str, typer.Option(help="Tenant id")] = "default",
    subject: Annotated[str, typer.Option(help="Subject (who)")] = "dev",
    scopes: Annotated[str, typer.Option(help="Space- or comma-separated scopes")] = (
        "runs:write runs:read runs:cancel approvals:write signals:write events:write"
    ),
    groups: Annotated[
        str, typer.Option(help="Space- or comma-separated groups (approvals may need one)")
    ] = "",
    ttl: Annotated[int, typer.Option(help="Lifetime in seconds")] = 86_400,
) -> None:
    """Print a dev-mode token (HS256, signed with the local dev secret).

    Refused unless the database is the embedded SQLite one or TREADLE_AUTH_MODE=dev is
    set explicitly.
    """
    from app.auth.dev import DevTokens, existing_dev_secret

    if ttl <= 0:
        _fail("--ttl must be a positive number of seconds")
    if not subject.strip():
        _fail("--subject must not be empty")
    from app.core.logging import configure_logging

    settings = load_settings()
    configure_logging(settings)  # the dev-mode warning is a log line on stderr, not stdout
    require_local_dev(settings, "token")
    secret = existing_dev_secret(settings)
    if secret is None:
        # Minting with a fresh secret here would print a token the server rejects: the
        # server signs with the secret in *its* working directory's data dir.
        where = (Path(settings.data_dir) / "dev-secret").resolve()
        _fail(
            f"no dev secret at {where}: `treadle dev` and `treadle serve` create it in "
            "their working directory's .treadle/. Run `treadle token` in that directory, "
            "or set TREADLE_DATA_DIR to that .treadle/ (or TREADLE_DEV_SECRET to the "
            "server's secret)."
        )
    try:
        minted = DevTokens(secret).mint(
            tenant_id=tenant,
            subject=subject,
            scopes=scopes.replace(",", " ").split(),
            groups=groups.replace(",", " ").split(),
            ttl_seconds=ttl,
        )
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(minted)


# --- API keys, straight on the database -------------------------------------------------

TENANT = Annotated[str, typer.Option("--tenant", help="Tenant id")]


def run_on_database(make: Callable[[Database], S], work: Callable[[S], Awaitable[None]]) -> None:
    """Open the database (schema at head), run ``work(make(db))``, report domain errors.

    For the commands that act on the database directly (``api-keys``, ``tenants``): a
    :class:`app.core.errors.TreadleError` is printed as one line and exits 2
    (:func:`app.cli.failures.explain`).
    """
    from app.db.database import Database

    settings = load_settings()

    async def main() -> None:
        await _require_schema(settings)
        db = Database(settings)
        try:
            await work(make(db))
        finally:
            await db.dispose()

    _run(main())


def _keys_run(work: Callable[[ApiKeyService], Awaitable[None]]) -> None:
    from app.engine.api_keys import ApiKeyService

    run_on_database(ApiKeyService, work)


def _operator() -> str:
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


@keys_app.command("create")
def keys_create(
    tenant: TENANT,
    name: Annotated[str, typer.Option(help="What the key is for")],
    scopes: Annotated[str, typer.Option(help="Space- or comma-separated scopes")],
) -> None:
    """Create an API key; the key is printed once (last line) and never shown again."""

    async def work(service: ApiKeyService) -> None:
        created = await service.create(
            tenant_id=tenant,
            name=name,
            scopes=scopes.replace(",", " ").split(),
            created_by=_operator(),
        )
        row = created.row
        typer.echo(f"key_id   {row['key_id']}")
        typer.echo(f"tenant   {row['tenant_id']}")
        typer.echo(f"name     {row['name']}")
        typer.echo(f"scopes   {row['scopes']}")
        typer.secho("api key (shown once; store it now):", err=True)
        typer.echo(created.token)

    _keys_run(work)


@keys_app.command("list")
def keys_list(
    tenant: TENANT,
    active: Annotated[bool, typer.Option("--active", help="Hide revoked keys")] = False,
) -> None:
    """List a tenant's API keys (never their secrets)."""

    async def work(service: ApiKeyService) -> None:
        rows = await service.list_keys(tenant, include_revoked=not active)
        for r in rows:
            state = f"revoked {r['revoked_at'].isoformat()}" if r["revoked_at"] else "active"
            used = r["last_used_at"].isoformat() if r["last_used_at"] else "never"
            typer.echo(
                f"{r['key_id']}  trd_{r['prefix']}_…  {r['name']!r}  [{r['scopes']}]  "
                f"{state}  last used {used}"
            )
        if not rows:
            typer.echo("(no keys)")

    _keys_run(work)


@keys_app.command("revoke")
def keys_revoke(key_id: str, tenant: TENANT) -> None:
    """Revoke an API key now; runs it submitted fail at their next attempt."""
    import uuid

    try:
        kid = uuid.UUID(key_id)
    except ValueError:
        _fail(f"{key_id!r} is not a key id (a UUID; see `treadle api-keys list`)")

    async def work(service: ApiKeyService) -> None:
        row = await service.revoke(tenant_id=tenant, key_id=kid, actor=_operator())
        typer.echo(f"revoked {row['key_id']} at {row['revoked_at'].isoformat()}")

    _keys_run(work)


class OutputFormat(StrEnum):
    """``-o`` / ``--output`` (formerly ``--format``) of ``treadle maintenance run``."""

    TEXT = "text"
    JSON = "json"


class TierOption(StrEnum):
    """``--tier`` values (mirrors ``app.engine.maintenance.Tier``)."""

    COMPACTION = "compaction"
    ARCHIVAL = "archival"
    AUDIT = "audit"


@maintenance_app.command("run")
def maintenance_run(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Do the work in a transaction, then roll back")
    ] = False,
    output: Annotated[
        OutputFormat,
        typer.Option("--output", "-o", "--format", help="text (default) or json"),
    ] = OutputFormat.TEXT,
    tier: Annotated[
        list[TierOption] | None,
        typer.Option("--tier", help="Run only this tier (repeatable); default all"),
    ] = None,
) -> None:
    """Compact, archive and trim finished runs of every tenant (windows from TREADLE_*).

    Compaction clears payloads of runs finished more than TREADLE_COMPACTION_AFTER_DAYS
    ago, archival moves runs finished more than TREADLE_ARCHIVAL_AFTER_DAYS ago to the
    archive, audit trimming deletes events and dead letters older than
    TREADLE_AUDIT_RETENTION_DAYS and applies every other table's retention rule (archived
    summaries, webhook deliveries, inbound events, batches, schedule fires, workers,
    sessions, rate-limit buckets; docs/operations.md). Live runs are never touched.
    """
    from app.core.logging import configure_logging
    from app.engine.maintenance import ALL_TIERS, MaintenanceReport, Tier, run_maintenance

    settings = load_settings()
    configure_logging(settings)  # logs on stderr: stdout is the report
    tiers = [Tier(t.value) for t in tier] if tier else list(ALL_TIERS)
    result: list[MaintenanceReport] = []

    async def go() -> None:
        from app.db.database import Database

        await _require_schema(settings)  # waited for as at `treadle serve`
        db = Database(settings)
        try:
            result.append(await run_maintenance(db, settings, tiers=tiers, dry_run=dry_run))
        finally:
            await db.dispose()

    _run(go())
    if not result:
        raise typer.Exit(1)
    report = result[0]
    if output is OutputFormat.JSON:
        typer.echo(stdjson.dumps(report.as_dict(), indent=2))
        return
    head = "DRY RUN (rolled back): would touch" if report.dry_run else "touched"
    typer.echo(f"maintenance {head} — {report.duration_seconds:.2f} s")
    if report.partitions_created:
        typer.echo(f"  partitions created ahead: {', '.join(report.partitions_created)}")
    for t in report.tiers:
        counts = ", ".join(f"{n} {table}" for table, n in t.touched.items()) or "nothing"
        typer.echo(
            f"  {t.tier.value:<10} older than {t.window_days:g} days "
            f"(before {t.cutoff.isoformat()}): {counts} in {t.batches} batch(es)"
        )


@maintenance_app.command("partitions")
def maintenance_partitions(
    output: Annotated[
        OutputFormat, typer.Option("--output", "-o", help="text (default) or json")
    ] = OutputFormat.TEXT,
) -> None:
    """Create the PostgreSQL time partitions missing ahead, then list them all.

    What every `treadle maintenance run` does first: partitions of steps, events and
    runs_archive, TREADLE_PARTITION_DAYS wide, until runs created
    TREADLE_PARTITIONS_AHEAD_DAYS from now have one (docs/adr/0036-time-partitions.md).
    Lists nothing on SQLite, which has no partitions.
    """
    from app.core.logging import configure_logging
    from app.engine.maintenance import PartitionInfo, ensure_partitions

    settings = load_settings()
    configure_logging(settings)
    result: list[tuple[list[str], list[PartitionInfo]]] = []

    async def go() -> None:
        from app.db.database import Database

        await _require_schema(settings)  # waited for as at `treadle serve`
        db = Database(settings)
        try:
            result.append(await ensure_partitions(db, settings))
        finally:
            await db.dispose()

    _run(go())
    if not result:
        raise typer.Exit(1)
    created, listed = result[0]
    if output is OutputFormat.JSON:
        doc = {
            "created": created,
            "partitions": [
                {
                    "table": p.table,
                    "name": p.name,
                    "starts": None if p.starts is None else p.starts.isoformat(),
                    "ends": None if p.ends is None else p.ends.isoformat(),
                }
                for p in listed
            ],
        }
        typer.echo(stdjson.dumps(doc, indent=2))
        return
    if not listed:
        typer.echo("no time partitions (SQLite, or a schema before revision 0023)")
        return
    typer.echo(
        f"created {len(created)} partition(s)" + (f": {', '.join(created)}" if created else "")
    )
    for p in listed:
        span = (
            "default (ids outside every range)"
            if p.starts is None or p.ends is None
            else f"runs created {p.starts:%Y-%m-%d %H:%M} to {p.ends:%Y-%m-%d %H:%M} UTC"
        )
        typer.echo(f"  {p.name:<28} {span}")


def main() -> None:
    """Console-script entry point (exit codes: :class:`app.cli.common.ExitCode`).

    Expected failures of every command become one line and an exit code in
    :class:`app.cli.failures.TreadleGroup`, the root group's class.
    """
    app()


if __name__ == "__main__":
    main()
