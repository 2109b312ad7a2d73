"""``treadle dev``: API and an in-process worker on the embedded SQLite default."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence

import typer

from app.api.app import create_app
from app.api.server import TreadleServer, server_config
from app.auth.dev import DevTokens, dev_secret
from app.auth.principal import ALL_SCOPES, APPROVER_SCOPES
from app.cli.ready import base_url, safe_database_url
from app.console.settings import console_config
from app.core import tracing
from app.core.logging import configure_logging
from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import migrate
from app.engine.registry import Registry
from app.worker.worker import Worker

# Open long-polls (GET /runs/{id}/result?wait=…) are cut after this long on shutdown.
GRACEFUL_SHUTDOWN_SECONDS = 5


async def run_dev(
    settings: Settings, handler_modules: list[str], approver_groups: Sequence[str] = ()
) -> None:
    """Migrate, then serve the API and run a worker in this process until Ctrl-C.

    Prints two dev tokens: ``TREADLE_TOKEN`` (subject ``dev``, every scope) and one for
    subject ``approver`` in ``approver_groups`` (none when empty: it decides approvals
    that name no group) with only :data:`~app.auth.principal.APPROVER_SCOPES` (read runs,
    decide approvals), so one person can start a run as ``dev`` and decide its approval
    as someone else (the API refuses self-approval by default), with ``--handlers`` too.
    """
    configure_logging(settings)
    tracing.setup("treadle")  # API and worker in one process: one service
    # Handlers first: a typo in --handlers is reported before the database is touched.
    registry = Registry.from_modules(handler_modules)
    await migrate(settings.database_url)
    db = Database(settings)
    worker = Worker(settings, db, registry)
    api = create_app(settings, db=db, on_wake=worker.wake)
    config = server_config(api, settings, graceful_shutdown_seconds=GRACEFUL_SHUTDOWN_SECONDS)
    server = TreadleServer(config)
    token = DevTokens(dev_secret(settings)).mint(
        tenant_id="default", subject="dev", scopes=ALL_SCOPES
    )
    approver = DevTokens(dev_secret(settings)).mint(
        tenant_id="default", subject="approver", scopes=APPROVER_SCOPES, groups=approver_groups
    )
    url = base_url(settings.host, settings.port, https=settings.ssl_certfile is not None)
    # Generated now (dev mode), so the console's first page load does not have to.
    console_config(settings)
    typer.echo(f"Treadle dev server on {url} (database {safe_database_url(settings.database_url)})")
    typer.echo(f"workflows: {', '.join(f'{n}@{v}' for n, v in registry.keys)}")
    typer.echo(f"console: {url}/ui/ (sign in with the TREADLE_TOKEN below)")
    typer.echo(f"export TREADLE_URL={url}")
    typer.echo(f"export TREADLE_TOKEN={token}")
    groups = ", ".join(approver_groups) or "none: add --approver-group G for group approvals"
    typer.echo(
        f"approver token (subject approver, groups {groups}, "
        f"scopes {','.join(sorted(APPROVER_SCOPES))}; "
        f"sign in with it in a second browser to decide approvals): {approver}"
    )

    loop = asyncio.get_running_loop()

    def stop() -> None:
        # A second Ctrl-C stops at once, without waiting for open long-polls.
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True
        worker.stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    # The API serves only once the worker has registered the examples: a first request
    # (the README's curl, the console's start form) must not find them unregistered.
    registered = asyncio.Event()
    worker_task = asyncio.create_task(worker.run(on_ready=lambda _: registered.set()))
    try:
        waiting = asyncio.create_task(registered.wait())
        await asyncio.wait({waiting, worker_task}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not registered.is_set():
            await worker_task  # stopped or failed before it registered: nothing to serve
            return
        server_task = asyncio.create_task(server._serve())
        await asyncio.gather(server_task, worker_task)
    finally:
        await db.dispose()
