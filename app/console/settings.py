"""The console's settings: its session secret and timeouts (``TREADLE_CONSOLE_*``).

The fields live on :class:`app.core.settings.Settings` (one settings object per process);
this module resolves the secret. Outside dev auth mode ``TREADLE_CONSOLE_SECRET`` must be
set for the console to serve pages (without it every ``/ui`` page answers 503 saying so,
and the API is unaffected). In dev auth mode it defaults to a random secret generated once
in ``<data_dir>/console-secret`` (mode 0600), shared by ``treadle dev`` and ``treadle
serve`` on one machine, as the dev token secret is.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from app.core.settings import AuthMode, Settings

SECRET_FILE = "console-secret"
MIN_SECRET_CHARS = 32


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """What the console needs from the settings, resolved once per process.

    Attributes:
        secret: the session secret, or None when the console is disabled.
        idle_seconds: a session unused this long ends.
        absolute_seconds: a session ends this long after sign-in.
    """

    secret: str | None
    idle_seconds: float
    absolute_seconds: float

    @property
    def disabled_reason(self) -> str | None:
        """Why the console cannot serve pages, or None when it can."""
        if self.secret is None:
            return (
                "The console is not configured: set TREADLE_CONSOLE_SECRET (at least "
                f"{MIN_SECRET_CHARS} random characters) on the API processes. It is "
                "required outside dev auth mode."
            )
        return None


def generated_secret(data_dir: Path) -> str:
    """Return ``<data_dir>/console-secret``, creating it (0600) with a random secret first."""
    path = Path(data_dir) / SECRET_FILE
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL: when two processes race, one creates the file and the other reads it.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    secret = secrets.token_urlsafe(48)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret)
    return secret


def console_config(settings: Settings) -> ConsoleConfig:
    """Resolve the console's configuration from the process settings.

    Reads (and in dev auth mode may create) ``<data_dir>/console-secret``, so it is called
    on the first console request, never while building the app (``openapi_document``
    builds one without any data directory).
    """
    secret = settings.console_secret
    if secret is None and settings.auth_mode == AuthMode.DEV:
        secret = generated_secret(settings.data_dir)
    return ConsoleConfig(
        secret=secret,
        idle_seconds=settings.console_idle_timeout_seconds,
        absolute_seconds=settings.console_absolute_timeout_seconds,
    )
