"""JWT bearer tokens from an identity provider, verified with joserfc against a JWKS.

Rules (RFC 7519, RFC 8725 "JWT best current practices"): the algorithm must be in the
allow-list (``none`` and HS* never are, which also closes HS/RS key confusion); the key is
chosen by ``kid`` from the provider's JWKS, fetched from a URL (the last good set cached; an
unknown ``kid`` triggers a refresh at most every ``TREADLE_JWKS_REFRESH_MIN_SECONDS``) or read
from a file; keys that cannot be loaded are a 503, not a 401 (:class:`JwksSource`);
``iss``, ``aud`` and ``exp`` are required, ``nbf``/``iat`` honoured, all with leeway.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import httpx
import structlog
from joserfc import jws, jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

from app.auth.principal import Principal, Scope
from app.core.errors import IdentityProviderUnavailable, Unauthenticated
from app.core.ids import is_tenant_id
from app.core.settings import Settings

log = structlog.get_logger("treadle.auth")


class JwksSource:
    """The provider's keys: a JWKS file, or a URL fetched with httpx and cached.

    The last key set that loaded is kept for as long as the process runs: a provider that
    goes down does not take valid tokens with it. A fetch happens on first use and, for an
    unknown ``kid`` (key rotation), at most every ``TREADLE_JWKS_REFRESH_MIN_SECONDS``;
    while no key set has loaded yet, a failed fetch is retried at most once a second.
    Concurrent callers share one fetch. When the keys needed to check a token cannot be
    had (nothing loaded yet, or the refresh an unknown ``kid`` asked for failed), the
    answer is :class:`IdentityProviderUnavailable` (503, retry later), never a 401: the
    token may be perfectly valid (docs/security.md).

    Args:
        settings: ``jwt_jwks_url`` / ``jwt_jwks_file`` and the refresh rate limit.
        client: HTTP client for the URL (tests pass one bound to a local server).
    """

    def __init__(self, settings: Settings, client: httpx.AsyncClient | None = None) -> None:
        self._url = settings.jwt_jwks_url
        self._file = settings.jwt_jwks_file
        self._min_interval = settings.jwks_refresh_min_seconds
        self._retry_interval = min(self._min_interval, _FAILED_RETRY_SECONDS)
        self._client = client
        self._keys: KeySet | None = None
        self._attempted_at = -math.inf  # monotonic end of the last fetch attempt
        self._last_ok = False
        self._lock = asyncio.Lock()

    async def keys(self, *, refresh: bool = False) -> KeySet:
        """The current key set; ``refresh`` re-fetches unless one happened very recently.

        Raises:
            IdentityProviderUnavailable: no key set has loaded yet, or ``refresh`` was
                asked and the latest fetch failed (the key may be in the provider's set).
        """
        asked = time.monotonic()
        async with self._lock:
            # A fetch that ended after we asked answers for us too (one fetch per burst).
            if self._attempted_at < asked:
                since = asked - self._attempted_at
                if (self._keys is None and since >= self._retry_interval) or (
                    refresh and since >= self._min_interval
                ):
                    await self._fetch()
            if self._keys is None or (refresh and not self._last_ok):
                raise IdentityProviderUnavailable(
                    "the identity provider's keys (JWKS) cannot be loaded; retry shortly"
                )
            return self._keys

    async def _fetch(self) -> None:
        try:
            self._keys = KeySet.import_key_set(await self._read())
            self._last_ok = True
        except (OSError, ValueError, TypeError, KeyError, httpx.HTTPError, JoseError) as exc:
            # Keep serving the last good key set; say why in the log only.
            self._last_ok = False
            log.warning(
                "JWKS fetch failed",
                source=self._url or str(self._file),
                error=f"{type(exc).__name__}: {exc}"[:300],
                cached_keys=self._keys is not None,
            )
        finally:
            self._attempted_at = time.monotonic()

    async def _read(self) -> Any:
        if self._file is not None:
            return json.loads(self._file.read_text())
        assert self._url is not None
        client = self._client or httpx.AsyncClient(timeout=5.0)
        try:
            response = await client.get(self._url)
            response.raise_for_status()
            return response.json()
        finally:
            if self._client is None:
                await client.aclose()


# While no key set has loaded yet, a failed fetch is retried at most this often.
_FAILED_RETRY_SECONDS = 1.0


class JwtVerifier:
    """Verify provider tokens and map their claims to a :class:`Principal`.

    Claim names come from settings: ``TREADLE_JWT_TENANT_CLAIM`` (default ``tenant``),
    ``TREADLE_JWT_SCOPE_CLAIM`` (``scope``: space-separated string or list) and
    ``TREADLE_JWT_GROUPS_CLAIM`` (``groups``).
    """

    def __init__(self, settings: Settings, source: JwksSource | None = None) -> None:
        self.settings = settings
        self.source = source or JwksSource(settings)
        self.algorithms = list(settings.jwt_algorithms)
        # An explicit registry: joserfc's default one refuses some algorithms the operator
        # may allow (Ed25519), and ours never contains none or HS*.
        self._registry = jws.JWSRegistry(algorithms=self.algorithms)
        self._claims = jwt.JWTClaimsRegistry(
            leeway=settings.jwt_leeway_seconds,
            iss={"essential": True, "value": settings.jwt_issuer or ""},
            aud={"essential": True, "value": settings.jwt_audience or ""},
            sub={"essential": True},
            exp={"essential": True},
        )

    async def verify(self, token: str) -> Principal:
        """Verify ``token`` and return its principal.

        Raises:
            Unauthenticated: malformed, wrong algorithm, unknown key (after a refresh),
                bad signature, expired, not yet valid, wrong issuer or audience, no
                tenant. The detail says which, for the log; the client never sees it.
            IdentityProviderUnavailable: the keys needed to check it cannot be loaded.
        """
        try:
            header = jws.extract_compact(token.encode("ascii")).headers()
        except (JoseError, ValueError, UnicodeError) as exc:
            raise Unauthenticated("invalid token: malformed") from exc
        alg = header.get("alg")
        if alg not in self.algorithms:
            raise Unauthenticated(f"invalid token: algorithm {alg!r} is not accepted")
        keys = await self.source.keys()
        try:
            try:
                decoded = jwt.decode(
                    token, keys, algorithms=self.algorithms, registry=self._registry
                )
            except InvalidKeyIdError:
                keys = await self.source.keys(refresh=True)  # the provider rotated its keys
                decoded = jwt.decode(
                    token, keys, algorithms=self.algorithms, registry=self._registry
                )
            self._claims.validate(decoded.claims)
        except (JoseError, ValueError) as exc:
            raise Unauthenticated(f"invalid token: {exc}") from exc
        return self._principal(decoded.claims)

    def _principal(self, claims: dict[str, Any]) -> Principal:
        s = self.settings
        tenant = claims.get(s.jwt_tenant_claim)
        if not is_tenant_id(tenant):
            raise Unauthenticated(f"invalid token: missing or malformed {s.jwt_tenant_claim!r}")
        raw_scopes = claims.get(s.jwt_scope_claim, "")
        names = raw_scopes.split() if isinstance(raw_scopes, str) else list(raw_scopes or [])
        scopes = frozenset(Scope(n) for n in names if n in Scope._value2member_map_)
        groups = claims.get(s.jwt_groups_claim) or []
        return Principal(
            tenant_id=tenant,
            subject=str(claims["sub"]),
            scopes=scopes,
            groups=frozenset(str(g) for g in groups) if isinstance(groups, list) else frozenset(),
        )
