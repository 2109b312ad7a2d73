"""``treadle dev``: API and an in-process worker on the embedded SQLite default."""

from __future__ import annotations

import asyncio
import signal

import typer
import uvicorn

from app.api.app import create_app
from app.api.server import server_config
from app.auth.dev import DevTokens, dev_secret
from app.auth.principal import ALL_SCOPES
from app.cli.ready import safe_database_url
from app.core.logging import configure_logging
from app.core.settings import Settings
from app.db.database import Database
from app.db.migrations import migrate
from app.engine.registry import Registry
from app.worker.worker import Worker

# Open long-polls (GET /runs/{id}/result?wait=…) are cut after this long on shutdown.
GRACEFUL_SHUTDOWN_SECONDS = 5


async def run_dev(settings: Settings, handler_modules: list[str]) -> None:
    """Migrate, then serve the API and run a worker in this process until Ctrl-C."""
    configure_logging(settings)
    # Handlers first: a typo in --handlers is reported before the database is touched.
    registry = Registry.from_modules(handler_modules)
    await migrate(settings.database_url)
    db = Database(settings)
    worker = Worker(settings, db, registry)
    api = create_app(settings, db=db, on_wake=worker.wake)
    config = server_config(api, settings, graceful_shutdown_seconds=GRACEFUL_SHUTDOWN_SECONDS)
    server = uvicorn.Server(config)
    token = DevTokens(dev_secret(settings)).mint(
        tenant_id="default", subject="dev", scopes=ALL_SCOPES
    )
    url = f"http://{settings.host}:{settings.port}"
    typer.echo(f"Treadle dev server on {url} (database {safe_database_url(settings.database_url)})")
    typer.echo(f"workflows: {', '.join(f'{n}@{v}' for n, v in registry.keys)}")
    typer.echo(f"export TREADLE_URL={url}")
    typer.echo(f"export TREADLE_TOKEN={token}")

    loop = asyncio.get_running_loop()

    def stop() -> None:
        # A second Ctrl-C stops at once, without waiting for open long-polls.
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True
        worker.stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    server_task = asyncio.create_task(server._serve())
    worker_task = asyncio.create_task(worker.run())
    try:
        await asyncio.gather(server_task, worker_task)
    finally:
        await db.dispose()
