"""Sealing a session's token: AES-GCM under a key derived from the session id (HKDF).

The key is ``HKDF-SHA256(ikm=session id, salt=TREADLE_CONSOLE_SECRET, info=…)``
(RFC 5869), so decrypting a stored token needs the cookie's session id, which only the
browser holds (the database keeps its SHA-256), *and* the server secret. The stored
``id_hash`` is the GCM associated data: a ciphertext moved to another row fails to open.
See docs/adr/0017-console-architecture.md.

The sign-in form's token is signed here too (:func:`login_token`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_INFO = b"treadle console session token v1"
_NONCE_BYTES = 12  # the GCM nonce size NIST SP 800-38D recommends


class TokenUnreadable(Exception):
    """A stored token cannot be opened (other secret, altered row, other session id)."""


def id_hash(session_id: str) -> str:
    """SHA-256 (hex) of a session id: the database key of its session."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def _key(session_id: str, secret: str) -> bytes:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=secret.encode(), info=_INFO)
    return hkdf.derive(session_id.encode())


def seal(token: str, *, session_id: str, secret: str) -> str:
    """Encrypt ``token``; return base64url text of nonce || ciphertext || tag."""
    nonce = os.urandom(_NONCE_BYTES)
    sealed = AESGCM(_key(session_id, secret)).encrypt(
        nonce, token.encode(), id_hash(session_id).encode()
    )
    return base64.urlsafe_b64encode(nonce + sealed).decode()


def open_sealed(text: str, *, session_id: str, secret: str) -> str:
    """Decrypt what :func:`seal` returned.

    Raises:
        TokenUnreadable: wrong session id or secret, or the text was altered.
    """
    try:
        raw = base64.urlsafe_b64decode(text.encode())
        plain = AESGCM(_key(session_id, secret)).decrypt(
            raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], id_hash(session_id).encode()
        )
        return plain.decode()
    except (InvalidTag, ValueError, UnicodeError) as exc:
        raise TokenUnreadable("the session's token cannot be opened") from exc


_LOGIN_INFO = b"treadle console sign-in form v1"


def _login_key(secret: str) -> bytes:
    # A key of its own for the sign-in form, so the session secret is never used raw.
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LOGIN_INFO)
    return hkdf.derive(secret.encode())


def _login_mac(nonce: str, issued: int, secret: str) -> str:
    mac = hmac.new(_login_key(secret), f"{nonce}.{issued}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


def login_token(nonce: str, *, secret: str, issued: int) -> str:
    """The sign-in form's token for the cookie's ``nonce``: ``<issued>.<HMAC>``.

    The HMAC-SHA256 is keyed by ``TREADLE_CONSOLE_SECRET`` (through HKDF) over the nonce
    and the issue time (Unix seconds), so only the server can make a token that matches a
    nonce: a page elsewhere that plants a nonce of its own cannot compute the field to go
    with it (OWASP CSRF cheat sheet, "signed double-submit cookie").
    """
    return f"{issued}.{_login_mac(nonce, issued, secret)}"


def login_token_valid(token: str, nonce: str, *, secret: str, now: int, ttl: int) -> bool:
    """Whether ``token`` is :func:`login_token`'s for ``nonce``, issued under ``ttl`` s ago.

    A token from the future (clock moved back) or older than ``ttl`` is refused too.
    """
    issued_text, _, mac = token.partition(".")
    if not issued_text.isdigit() or len(issued_text) > 12 or not nonce:
        return False
    issued = int(issued_text)
    if not (now - ttl <= issued <= now + 60):
        return False
    return hmac.compare_digest(mac.encode(), _login_mac(nonce, issued, secret).encode())
