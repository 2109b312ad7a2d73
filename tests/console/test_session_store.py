"""The console's session store on both databases, and the sealing of its tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update

from app.console import crypto
from app.console.settings import console_config, generated_secret
from app.console.web import safe_next
from app.core.settings import AuthMode
from app.db.database import Database
from app.db.dialect import now_plus
from app.db.queries import console_sessions as q
from app.db.tables import console_sessions
from tests.conftest import make_settings

IDLE = 600.0


async def _insert(conn: object, id_hash: str, absolute: float = 3600.0) -> None:
    await q.insert_session(
        conn,  # type: ignore[arg-type]
        id_hash=id_hash,
        tenant_id="acme",
        subject="alice",
        token_ciphertext="sealed",
        csrf_token="c" * 43,
        absolute_seconds=absolute,
    )


async def test_live_idle_absolute_and_deleted_sessions(db: Database) -> None:
    async with db.write() as conn:
        for name in ("live", "idle", "old", "gone"):
            await _insert(conn, name)
        # Age two sessions past each deadline with the database clock.
        dialect = conn.dialect.name
        await conn.execute(
            update(console_sessions)
            .where(console_sessions.c.id_hash == "idle")
            .values(last_seen_at=now_plus(dialect, -IDLE - 5))
        )
        await conn.execute(
            update(console_sessions)
            .where(console_sessions.c.id_hash == "old")
            .values(expires_at=now_plus(dialect, -1))
        )
        assert await q.delete_session(conn, "gone") is True
        assert await q.delete_session(conn, "gone") is False
    async with db.write() as conn:
        live = await q.touch_live_session(conn, "live", idle_seconds=IDLE)
        assert live is not None and live["subject"] == "alice" and live["tenant_id"] == "acme"
        assert await q.get_live_session(conn, "live", idle_seconds=IDLE) is not None
        assert await q.get_live_session(conn, "idle", idle_seconds=IDLE) is None
        assert await q.get_live_session(conn, "old", idle_seconds=IDLE) is None
        assert await q.touch_live_session(conn, "idle", idle_seconds=IDLE) is None
        assert await q.touch_live_session(conn, "old", idle_seconds=IDLE) is None
        assert await q.touch_live_session(conn, "gone", idle_seconds=IDLE) is None
        # A flash is shown once.
        await q.set_flash(conn, "live", '{"kind": "status", "text": "hi"}')
        assert await q.take_flash(conn, "live") == '{"kind": "status", "text": "hi"}'
        assert await q.take_flash(conn, "live") is None
        assert await q.take_flash(conn, "nobody") is None
        # Clean-up removes exactly the ended ones.
        assert await q.delete_ended(conn, idle_seconds=IDLE) == 2
        assert await q.delete_ended(conn, idle_seconds=IDLE) == 0
        assert await q.touch_live_session(conn, "live", idle_seconds=IDLE) is not None


def test_sealed_tokens_open_only_with_their_id_and_secret() -> None:
    secret = "s" * 40
    sealed = crypto.seal("trd_token", session_id="id-1", secret=secret)
    assert "trd_token" not in sealed
    assert crypto.open_sealed(sealed, session_id="id-1", secret=secret) == "trd_token"
    assert crypto.seal("trd_token", session_id="id-1", secret=secret) != sealed  # fresh nonce
    for session_id, key in (("id-2", secret), ("id-1", "t" * 40)):
        with pytest.raises(crypto.TokenUnreadable):
            crypto.open_sealed(sealed, session_id=session_id, secret=key)
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    for text in (tampered, "", "!!!"):
        with pytest.raises(crypto.TokenUnreadable):
            crypto.open_sealed(text, session_id="id-1", secret=secret)
    assert crypto.id_hash("id-1") != crypto.id_hash("id-2") and len(crypto.id_hash("x")) == 64


def test_console_secret_is_generated_in_dev_mode_only(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    dev = make_settings(url, tmp_path, auth_mode=AuthMode.DEV)
    first = console_config(dev)
    assert first.secret is not None and len(first.secret) >= 32
    assert console_config(dev).secret == first.secret == generated_secret(tmp_path / "data")
    assert (tmp_path / "data" / "console-secret").stat().st_mode & 0o777 == 0o600
    jwks = tmp_path / "jwks.json"
    jwks.write_text('{"keys": []}')
    jwt = make_settings(
        url,
        tmp_path,
        auth_mode=AuthMode.JWT,
        jwt_issuer="https://idp",
        jwt_audience="treadle",
        jwt_jwks_file=jwks,
    )
    off = console_config(jwt)
    assert off.secret is None and "TREADLE_CONSOLE_SECRET" in (off.disabled_reason or "")
    on = console_config(jwt.model_copy(update={"console_secret": "k" * 32}))
    assert on.secret == "k" * 32 and on.disabled_reason is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/ui/runs?status=failed", "/ui/runs?status=failed"),
        ("/ui/approvals", "/ui/approvals"),
        (None, "/ui/runs"),
        ("", "/ui/runs"),
        ("https://evil.example/ui/", "/ui/runs"),
        ("//evil.example/ui/", "/ui/runs"),
        ("/ui/\\\\evil.example", "/ui/runs"),
        ("/other", "/ui/runs"),
        ("/ui/\nSet-Cookie: x", "/ui/runs"),
    ],
)
def test_next_is_a_console_path_or_the_default(value: str | None, expected: str) -> None:
    assert safe_next(value) == expected
