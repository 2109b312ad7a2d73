"""Server-side console sessions: sign-in, look-up, flash messages and sign-out.

The session cookie (:data:`app.console.cookies.SESSION`: ``__Host-treadle_console`` with
Secure and Path=/ on https, ``treadle_console`` with Path=/ui on http; HttpOnly,
SameSite=Lax) holds a random session id (``secrets.token_urlsafe(32)``). The
``console_sessions`` row is keyed by its SHA-256 and keeps the user's token sealed under
a key derived from the id and ``TREADLE_CONSOLE_SECRET`` (:mod:`app.console.crypto`), the
CSRF token, a one-shot flash message and the idle and absolute deadlines (checked with
the database clock).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Request, Response

from app.client import TreadleAPIError
from app.console import cookies, crypto
from app.console.client import in_process_client
from app.console.settings import ConsoleConfig, console_config
from app.db.database import Database
from app.db.queries import console_sessions as sessions_q

MAX_TOKEN_CHARS = 16_384
REFRESH_HEADER = "x-console-fragment"
"""Sent by the live-refresh script: such requests do not count as activity."""
FlashKind = Literal["status", "alert"]


class ConsoleDisabled(Exception):
    """The console has no session secret (``TREADLE_CONSOLE_SECRET``): pages answer 503."""


class NotSignedIn(Exception):
    """No live session for this request: pages redirect to ``/ui/login``."""


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """A live session, loaded for one request.

    Attributes:
        id_hash: the row key (SHA-256 of the cookie's id); never the id itself.
        tenant_id: the tenant the token authenticated as at sign-in.
        subject: the token's subject at sign-in.
        token: the user's bearer token (decrypted; never logged or rendered).
        csrf_token: the value every POST form must carry as ``csrf_token``.
    """

    id_hash: str
    tenant_id: str
    subject: str
    token: str
    csrf_token: str


def get_config(request: Request) -> ConsoleConfig:
    """The console's configuration, resolved on first use and kept on ``app.state``.

    Raises:
        ConsoleDisabled: no session secret is configured.
    """
    config: ConsoleConfig | None = getattr(request.app.state, "console_config", None)
    if config is None:
        config = console_config(request.app.state.settings)
        request.app.state.console_config = config
    if config.secret is None:
        raise ConsoleDisabled(config.disabled_reason)
    return config


def _db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def clean_token(raw: str) -> str:
    """A pasted token without surrounding blanks or a leading ``Bearer `` (as copied)."""
    token = raw.strip()
    if token[:7].lower() == "bearer ":
        token = token[7:].strip()
    return token


async def start_session(request: Request, response: Response, token: str) -> None:
    """Validate ``token`` through the API, create a session and set its cookie on ``response``.

    The token is checked with ``GET /whoami`` in-process, exactly as the API checks any
    request: the session's tenant and subject are the API's answer. The OIDC callback
    calls this with the access token it obtained. A session this browser already had
    (its cookie on ``request``) ends: one browser, one session.

    Raises:
        TreadleAPIError: the API refused the token (``detail`` says why; 401, or 403 for
            a suspended tenant), or it is empty or longer than 16,384 characters (400).
        ConsoleDisabled: no session secret is configured.
    """
    config = get_config(request)
    assert config.secret is not None  # get_config raised otherwise
    token = clean_token(token)
    if not token or len(token) > MAX_TOKEN_CHARS or not token.isprintable():
        raise TreadleAPIError(
            "paste an API key (trd_…) or a bearer token: one line of at most "
            f"{MAX_TOKEN_CHARS} printable characters",
            code="invalid_token_text",
            status=400,
        )
    async with in_process_client(request.app, token) as api:
        who = await api.whoami()
    session_id = secrets.token_urlsafe(32)
    id_hash = crypto.id_hash(session_id)
    previous = cookies.SESSION.read(request)
    async with _db(request).write() as conn:
        await sessions_q.delete_ended(conn, idle_seconds=config.idle_seconds)
        if previous:
            # Signing in again replaces this browser's session: the old one ends now
            # rather than live on, unreachable, until its timeout.
            await sessions_q.delete_session(conn, crypto.id_hash(previous))
        await sessions_q.insert_session(
            conn,
            id_hash=id_hash,
            tenant_id=who.tenant_id,
            subject=who.subject,
            token_ciphertext=crypto.seal(token, session_id=session_id, secret=config.secret),
            csrf_token=secrets.token_urlsafe(32),
            absolute_seconds=config.absolute_seconds,
        )
    cookies.SESSION.set(request, response, session_id, max_age=int(config.absolute_seconds))


async def load_session(request: Request) -> ConsoleSession | None:
    """The request's live session, or None.

    Its ``last_seen_at`` moves to now, except on a background refresh (a request with
    the ``X-Console-Fragment`` header), so a tab left open still idles out.
    """
    config = get_config(request)
    assert config.secret is not None
    session_id = cookies.SESSION.read(request)
    if not session_id or len(session_id) > 128:
        return None
    id_hash = crypto.id_hash(session_id)
    if request.headers.get(REFRESH_HEADER):
        # A background refresh (static/console.js) is not the user's activity.
        async with _db(request).read() as conn:
            row = await sessions_q.get_live_session(conn, id_hash, idle_seconds=config.idle_seconds)
    else:
        async with _db(request).write() as conn:
            row = await sessions_q.touch_live_session(
                conn, id_hash, idle_seconds=config.idle_seconds
            )
    if row is None:
        return None
    try:
        token = crypto.open_sealed(
            row["token_ciphertext"], session_id=session_id, secret=config.secret
        )
    except crypto.TokenUnreadable:
        return None  # the secret was rotated: every old session simply ends
    return ConsoleSession(
        id_hash=id_hash,
        tenant_id=row["tenant_id"],
        subject=row["subject"],
        token=token,
        csrf_token=row["csrf_token"],
    )


async def require_session(request: Request) -> ConsoleSession:
    """FastAPI dependency: the live session.

    Raises:
        NotSignedIn: none (the console's handler redirects to ``/ui/login?next=…``).
        ConsoleDisabled: no session secret is configured (503 page).
    """
    session = await load_session(request)
    if session is None:
        raise NotSignedIn()
    return session


async def end_session(request: Request, session: ConsoleSession, response: Response) -> None:
    """Delete the session's row and clear its cookie on ``response`` (sign-out)."""
    async with _db(request).write() as conn:
        await sessions_q.delete_session(conn, session.id_hash)
    clear_cookie(request, response)


async def end_session_by_hash(request: Request, id_hash: str) -> None:
    """Delete a session's row (its token was refused by the API: it is of no more use)."""
    async with _db(request).write() as conn:
        await sessions_q.delete_session(conn, id_hash)


def clear_cookie(request: Request, response: Response) -> None:
    """Expire the session cookie in the browser."""
    cookies.SESSION.clear(request, response)


async def flash(request: Request, session: ConsoleSession, kind: FlashKind, text: str) -> None:
    """Keep one message for the session's next full page.

    ``status`` messages render in ``<div role="status">``, ``alert`` ones in
    ``<div role="alert">`` (docs/console.md). A later flash replaces an unshown one.
    """
    async with _db(request).write() as conn:
        await sessions_q.set_flash(conn, session.id_hash, json.dumps({"kind": kind, "text": text}))


async def take_flash(request: Request, session: ConsoleSession) -> tuple[FlashKind, str] | None:
    """The session's pending message, cleared as it is read."""
    async with _db(request).write() as conn:
        raw = await sessions_q.take_flash(conn, session.id_hash)
    if raw is None:
        return None
    data = json.loads(raw)
    kind: FlashKind = "alert" if data.get("kind") == "alert" else "status"
    return kind, str(data.get("text", ""))


Session = Annotated[ConsoleSession, Depends(require_session)]
"""Route parameter type: the signed-in session (redirects to sign-in without one)."""
