"""Per-tenant API keys: format, generation and verification (no database here).

A key reads ``trd_<prefix>_<secret>``: ``prefix`` is 12 hex characters, public, stored
and unique, so a presented key is found with one indexed lookup; ``secret`` is 32 random
bytes (base64url). Only the SHA-256 of the whole key is stored and it is compared in
constant time (``hmac.compare_digest``). A slow password hash would add nothing: with 256
random bits there is nothing to guess (the reasoning of GitHub's and Stripe's tokens).
The ``trd_`` marker tells an API key from a JWT (which always starts with ``ey``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

API_KEY_MARKER = "trd_"
_KEY_RE = re.compile(r"^trd_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True, slots=True)
class NewApiKey:
    """A freshly generated key: show ``token`` once, store ``prefix`` and ``secret_hash``."""

    token: str
    prefix: str
    secret_hash: str


def is_api_key(token: str) -> bool:
    """True if the bearer token claims to be an API key (by its ``trd_`` marker)."""
    return token.startswith(API_KEY_MARKER)


def hash_key(token: str) -> str:
    """SHA-256 (hex) of a whole key: what the database stores."""
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def generate() -> NewApiKey:
    """Generate a key with 256 bits of secret."""
    prefix = secrets.token_hex(6)
    token = f"{API_KEY_MARKER}{prefix}_{secrets.token_urlsafe(32)}"
    return NewApiKey(token=token, prefix=prefix, secret_hash=hash_key(token))


def parse_prefix(token: str) -> str | None:
    """The lookup prefix of a well-formed key, or None when the key is malformed."""
    match = _KEY_RE.match(token)
    return match.group(1) if match else None


def matches(token: str, stored_hash: str) -> bool:
    """Constant-time check of a presented key against its stored hash."""
    return hmac.compare_digest(hash_key(token), stored_hash)
