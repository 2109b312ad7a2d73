"""The one line ``treadle serve`` and ``treadle worker`` print on stdout once ready.

Operators and scripts wait for it (``grep -m1 ready``) instead of polling: it names
where the process listens, which database it uses (password hidden) and which workflows
it knows.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import typer
import uvicorn
from sqlalchemy.engine import make_url

from app.api.server import TreadleServer
from app.core import heap
from app.core.settings import AuthMode, Settings


def safe_database_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (what may appear in logs)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as its scheme only
        return url.split(":", 1)[0] + ":…"


def _workflows(keys: Sequence[str]) -> str:
    return ", ".join(keys) if keys else "none registered yet"


def base_url(host: str, port: int, *, https: bool = False) -> str:
    """``http://HOST:PORT`` (``https://`` when serving TLS; an IPv6 host in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if https else 'http'}://{shown}:{port}"


def console_note(settings: Settings) -> str:
    """``console http://HOST:PORT/ui/``, or why the console is off (docs/console.md)."""
    if settings.console_secret is None and settings.auth_mode != AuthMode.DEV:
        return "console off: set TREADLE_CONSOLE_SECRET"
    https = settings.ssl_certfile is not None
    return f"console {base_url(settings.host, settings.port, https=https)}/ui/"


def serve_line(
    host: str,
    port: int,
    database_url: str,
    workflows: Sequence[str],
    console: str = "",
    *,
    https: bool = False,
) -> str:
    """``treadle serve: ready on http://HOST:PORT (database …; workflows …; console …)``.

    ``https``: the server serves TLS itself (``TREADLE_SSL_CERTFILE``): ``https://``.
    """
    tail = f"; {console}" if console else ""
    return (
        f"treadle serve: ready on {base_url(host, port, https=https)} "
        f"(database {safe_database_url(database_url)}; workflows {_workflows(workflows)}{tail})"
    )


def worker_line(
    worker_id: str, database_url: str, workflows: Sequence[str], concurrency: int
) -> str:
    """``treadle worker: ready as ID (database …; workflows …; concurrency N)``."""
    return (
        f"treadle worker: ready as {worker_id} on {socket.gethostname()} "
        f"(database {safe_database_url(database_url)}; workflows {_workflows(workflows)}; "
        f"concurrency {concurrency})"
    )


class AnnouncingServer(TreadleServer):
    """A uvicorn server that prints ``line`` once it listens and its lifespan started."""

    def __init__(self, config: uvicorn.Config, line: str) -> None:
        super().__init__(config)
        self.line = line

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start as uvicorn does; then, if started, print the ready line."""
        await super().startup(sockets=sockets)
        if self.started:
            heap.settle()  # started: what is alive now lives as long as the process
            typer.echo(self.line)
