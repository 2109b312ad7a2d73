"""A bounded, per-process cache of verified bearer tokens (docs/security.md#token-cache).

Checking a token costs a signature verification (a JWT: RSA or ECDSA, plus joserfc's claim
checks) or an indexed database read (an API key); a client sends the same token on every
request. So each API process remembers, for a short while, which tokens it verified and
whose they are:

- **Keyed by the token's SHA-256**, never the token: a heap dump, a debugger or a log of
  the cache shows digests that cannot be presented as credentials.
- **Never past the token's ``exp``**, nor past ``TREADLE_AUTH_CACHE_TTL_SECONDS`` after it
  was verified (API keys have no ``exp``: the TTL alone). The expiry is checked again on
  every hit against the wall clock, which is what the verifiers compare ``exp`` with; the
  leeway a verifier grants past ``exp`` is never cached, so such a token goes back to the
  verifier each time, as before.
- **Bounded**: at most ``TREADLE_AUTH_CACHE_SIZE`` tokens, least recently used evicted
  first (cachetools' ``TLRUCache``: LRU order, an expiry per entry).
- **Only successes**: a refused token (forged, expired, unknown, revoked) raises and is
  never stored, so it is verified again, and refused again, on every request.
- **Provider keys**: a JWT's entry records the version of the provider's key set it was
  verified against (:attr:`app.auth.jwt.JwksSource.version`); once a fetch loads a set
  unlike that one (rotation, a key withdrawn), the entry is a miss and the token is
  verified against the new set.
- **Revocation**: revoking an API key through this process drops its entries at once
  (:meth:`TokenCache.forget_api_key`), including a verification that was under way while
  the revocation committed (the generation check in :meth:`TokenCache.put`). A revocation
  made by another process or the CLI reaches this one within the TTL.

What the cache holds is the token's *verification*: tenant suspension is still checked on
every request (its own window, ``TREADLE_TENANT_CACHE_SECONDS``), and an API key's scopes
cannot change after it is created (rotate the key instead), so a cached principal keeps
the meaning it had when it was verified.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TLRUCache

from app.auth.principal import Principal


@dataclass(frozen=True, slots=True)
class Verified:
    """A token a verifier accepted.

    Attributes:
        principal: whose it is.
        expires_at: its ``exp`` (Unix seconds, wall clock), or None for a token without
            one (an API key lives until it is revoked).
        keys_version: the version of the provider's key set that checked its signature
            (jwt mode), or None when no fetched key set was involved.
    """

    principal: Principal
    expires_at: float | None = None
    keys_version: int | None = None


def digest(token: str) -> bytes:
    """The cache key of ``token``: its SHA-256 (32 bytes), never the token itself."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class TokenCache:
    """Verified tokens of this process: a bounded LRU, each entry with its own expiry.

    Single-threaded by design (one event loop per API process): no lock.

    Args:
        size: most tokens held (``TREADLE_AUTH_CACHE_SIZE``); 0 turns the cache off.
        ttl_seconds: longest an entry is trusted after its verification
            (``TREADLE_AUTH_CACHE_TTL_SECONDS``); 0 turns the cache off.
        clock: the wall clock ``exp`` is compared with (Unix seconds; tests may pass
            their own).
    """

    def __init__(
        self, *, size: int, ttl_seconds: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.size = size
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self.enabled = size > 0 and ttl_seconds > 0
        # Bumped by every revocation: a verification that started before one may have
        # read the key as live, so its result is not stored (put()).
        self.generation = 0
        # The TTL is measured on the monotonic clock (a wall-clock step back must not
        # stretch the revocation window); exp is a wall-clock instant, so it is turned
        # into the time left when the entry is stored, and checked again on each hit.
        self._entries: TLRUCache[bytes, Verified] = TLRUCache(
            maxsize=max(size, 1), ttu=self._expires, timer=time.monotonic
        )

    def __len__(self) -> int:
        """How many tokens are held now (expired ones included until they are touched)."""
        return len(self._entries)

    def digests(self) -> frozenset[bytes]:
        """The keys held now (for inspection: they are digests, never tokens)."""
        return frozenset(self._entries.keys())

    def get(self, token: str, *, keys_version: int | None = None) -> Principal | None:
        """The principal of ``token`` if this process verified it within its lifetime.

        ``keys_version`` is the provider's key set version now: an entry verified against
        another version is dropped (a miss).
        """
        hit = self.get_verified(token, keys_version=keys_version)
        return None if hit is None else hit.principal

    def get_verified(self, token: str, *, keys_version: int | None = None) -> Verified | None:
        """The verification of ``token`` (principal and ``exp``) if it is held: see :meth:`get`."""
        if not self.enabled:
            return None
        key = digest(token)
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit.expires_at is not None and hit.expires_at <= self._clock():
            # The wall clock moved past exp faster than the monotonic one: refuse to trust.
            self._entries.pop(key, None)
            return None
        if hit.keys_version is not None and hit.keys_version != keys_version:
            self._entries.pop(key, None)
            return None
        return hit

    def put(self, token: str, verified: Verified, *, generation: int) -> None:
        """Remember a verification that began when :attr:`generation` was ``generation``.

        Skipped when a revocation happened meanwhile (the verification may have read
        the key before the revocation committed) or when the token is already at or
        past its ``exp`` (a verifier's leeway is not cached).
        """
        if not self.enabled or generation != self.generation:
            return
        if verified.expires_at is not None and verified.expires_at <= self._clock():
            return
        self._entries[digest(token)] = verified

    def forget_api_key(self, key_id: uuid.UUID) -> None:
        """Drop every entry of API key ``key_id`` (called once its revocation committed).

        A scan: revocations are rare and the cache is bounded.
        """
        self.generation += 1
        stale = [k for k, v in self._entries.items() if v.principal.api_key_id == key_id]
        for key in stale:
            self._entries.pop(key, None)

    def clear(self) -> None:
        """Drop every entry."""
        self.generation += 1
        self._entries.clear()

    def _expires(self, _key: bytes, value: Verified, now: float) -> float:
        lifetime = self.ttl_seconds
        if value.expires_at is not None:
            lifetime = min(lifetime, value.expires_at - self._clock())
        return now + lifetime
