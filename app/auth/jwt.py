"""JWT bearer tokens from an identity provider, verified with joserfc against a JWKS.

The JWKS comes from an OpenID Connect issuer by discovery, a URL or a file; the provider
is reached through authlib (ADR 0018).

Rules (RFC 7519, RFC 8725 "JWT best current practices"): the algorithm must be in the
allow-list (``none`` and HS* never are, which also closes HS/RS key confusion); the key is
chosen by ``kid`` from the provider's JWKS, fetched from the issuer's ``jwks_uri`` or a URL
(the last good set cached, refreshed in the background; an unknown ``kid`` triggers a refresh at
most every ``TREADLE_JWKS_REFRESH_MIN_SECONDS``) or read from a file; keys that cannot be
loaded are a 503, not a 401 (:class:`JwksSource`); ``iss``, ``aud`` and ``exp`` are required,
``nbf``/``iat`` honoured, all with leeway.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import warnings
from typing import Any

import httpx
import structlog
from authlib.oidc.discovery import get_well_known_url
from joserfc import jws, jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

from app.auth.principal import Principal, Scope
from app.auth.token_cache import Verified
from app.core.errors import IdentityProviderUnavailable, Unauthenticated
from app.core.ids import is_tenant_id
from app.core.settings import Settings
from app.core.tasks import cancel_and_wait

with warnings.catch_warnings():
    # authlib 1.9.10 warns on import that it prefers httpx2; it still supports httpx, which
    # Treadle uses everywhere (ADR 0018). Imported here only, so the warning never prints.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated")
    from authlib.integrations.httpx_client import AsyncOAuth2Client

__all__ = ["AsyncOAuth2Client", "JwksSource", "JwtVerifier"]

log = structlog.get_logger("treadle.auth")


class JwksSource:
    """The provider's keys: an OIDC issuer's (by discovery), a JWKS URL's, or a file's.

    With ``TREADLE_OIDC_ISSUER`` the issuer's ``/.well-known/openid-configuration``
    (OpenID Connect Discovery 1.0) is read once, its ``issuer`` must be the configured one
    (section 4.3) and its ``jwks_uri`` gives the keys; the console's sign-in
    (:mod:`app.auth.oidc`) reads its endpoints from the same document. Every request to
    the provider goes through authlib's httpx client (``AsyncOAuth2Client``); the key set
    is parsed by joserfc, which authlib itself uses for JOSE.

    The last key set that loaded is kept for as long as the process runs: a provider that
    goes down does not take valid tokens with it. A fetch happens on first use, every
    ``TREADLE_JWKS_REFRESH_INTERVAL_SECONDS`` in the background (:meth:`start`), and, for
    an unknown ``kid`` (key rotation), at most every ``TREADLE_JWKS_REFRESH_MIN_SECONDS``;
    while no key set has loaded yet, a failed fetch is retried at most once a second.
    Concurrent callers share one fetch. When the keys needed to check a token cannot be
    had (nothing loaded yet, or the refresh an unknown ``kid`` asked for failed), the
    answer is :class:`IdentityProviderUnavailable` (503, retry later), never a 401: the
    token may be perfectly valid (docs/security.md).

    Args:
        settings: ``oidc_issuer`` / ``jwt_jwks_url`` / ``jwt_jwks_file``, the refresh rate
            limit and the background interval.
    """

    def __init__(self, settings: Settings) -> None:
        self._issuer = settings.oidc_issuer
        self._url = settings.jwt_jwks_url
        self._file = settings.jwt_jwks_file
        self._min_interval = settings.jwks_refresh_min_seconds
        self._interval = settings.jwks_refresh_interval_seconds
        self._retry_interval = min(self._min_interval, _FAILED_RETRY_SECONDS)
        self._keys: KeySet | None = None
        # Bumped whenever a fetch loads a key set unlike the last one: the authenticator
        # then stops trusting JWTs it verified against the old set (app/auth/token_cache.py).
        self.version = 0
        self._loaded: str | None = None
        self._metadata: dict[str, Any] | None = None
        self._attempted_at = -math.inf  # monotonic end of the last fetch attempt
        self._last_ok = False
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

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

    async def metadata(self) -> dict[str, Any]:
        """The issuer's discovery document (``TREADLE_OIDC_ISSUER`` only), read once.

        Raises:
            IdentityProviderUnavailable: it cannot be read yet, or is not the issuer's.
            RuntimeError: no ``TREADLE_OIDC_ISSUER`` is configured.
        """
        if self._issuer is None:
            raise RuntimeError("TREADLE_OIDC_ISSUER is not set")
        if self._metadata is None:
            async with self._lock:
                if self._metadata is None:
                    try:
                        await self._discover()
                    except _FETCH_ERRORS as exc:
                        self._log_failure("OIDC discovery failed", exc)
                        raise IdentityProviderUnavailable(
                            "the identity provider's discovery document cannot be read; "
                            "retry shortly"
                        ) from None
        assert self._metadata is not None
        return self._metadata

    async def refresh(self) -> bool:
        """Fetch the key set now, whatever the rate limit; True if it loaded.

        The background refresh calls this; a failure keeps the last good set.
        """
        async with self._lock:
            await self._fetch()
            return self._last_ok

    def start(self) -> None:
        """Start the background refresh (URL or issuer, interval > 0; call in a loop).

        The first fetch happens at once, so the keys are usually loaded before the first
        token arrives; a failure there is only logged (requests retry it themselves).
        """
        if self._task is None and self._file is None and self._interval > 0:
            self._task = asyncio.create_task(self._refresh_forever(), name="jwks-refresh")

    async def aclose(self) -> None:
        """Stop the background refresh (idempotent), returning once it has ended.

        Cancelled until it ends (:func:`app.core.tasks.cancel_and_wait`): its fetch awaits
        httpx, and a cancellation lost in a completing await would leave it refreshing
        after shutdown (and the API's lifespan waiting on it).
        """
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])

    async def _refresh_forever(self) -> None:
        while True:
            await self.refresh()
            # A schedule, not a wait for something: the provider gives no change signal.
            await asyncio.sleep(self._interval)

    async def _fetch(self) -> None:
        try:
            document = await self._read()
            self._keys = KeySet.import_key_set(document)
            self._last_ok = True
            loaded = json.dumps(document, sort_keys=True)
            if loaded != self._loaded:
                self._loaded = loaded
                self.version += 1
        except _FETCH_ERRORS as exc:
            # Keep serving the last good key set; say why in the log only.
            self._last_ok = False
            self._log_failure("JWKS fetch failed", exc)
        finally:
            self._attempted_at = time.monotonic()

    def _log_failure(self, event: str, exc: BaseException) -> None:
        log.warning(
            event,
            source=self._issuer or self._url or str(self._file),
            error=f"{type(exc).__name__}: {exc}"[:300],
            cached_keys=self._keys is not None,
        )

    async def _discover(self) -> None:
        assert self._issuer is not None
        document = await self._get_json(get_well_known_url(self._issuer, external=True))
        if not isinstance(document, dict):
            raise ValueError("the discovery document is not a JSON object")
        # OIDC Discovery 1.0, section 4.3: the issuer in the document must be exactly the
        # one configured, or a document served elsewhere could vouch for other keys.
        if document.get("issuer") != self._issuer:
            raise ValueError(
                f"the discovery document's issuer {document.get('issuer')!r} is not "
                f"TREADLE_OIDC_ISSUER {self._issuer!r}"
            )
        if not isinstance(document.get("jwks_uri"), str):
            raise ValueError("the discovery document has no jwks_uri")
        self._metadata = document

    async def _read(self) -> Any:
        if self._file is not None:
            return json.loads(self._file.read_text())
        if self._issuer is not None:
            if self._metadata is None:
                await self._discover()
            assert self._metadata is not None
            return await self._get_json(self._metadata["jwks_uri"])
        assert self._url is not None
        return await self._get_json(self._url)

    async def _get_json(self, url: str) -> Any:
        async with AsyncOAuth2Client(timeout=_HTTP_TIMEOUT_SECONDS) as client:
            # Public documents: no OAuth token is sent (there is none to send).
            response = await client.request("GET", url, withhold_token=True)
        response.raise_for_status()
        return response.json()


# While no key set has loaded yet, a failed fetch is retried at most this often.
_FAILED_RETRY_SECONDS = 1.0
# One request to the provider (connect, read): a token check waits at most this long.
_HTTP_TIMEOUT_SECONDS = 5.0
_FETCH_ERRORS = (OSError, ValueError, TypeError, KeyError, httpx.HTTPError, JoseError)


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
        return (await self.verified(token)).principal

    async def verified(self, token: str) -> Verified:
        """Verify ``token`` as :meth:`verify` does; also return its ``exp`` (Unix seconds).

        The authenticator's cache (:mod:`app.auth.token_cache`) keeps the result no
        longer than that ``exp``.

        Raises:
            Unauthenticated: as :meth:`verify`.
            IdentityProviderUnavailable: as :meth:`verify`.
        """
        decoded, keys_version = await self._decode(token)
        try:
            self._claims.validate(decoded.claims)
        except (JoseError, ValueError) as exc:
            raise Unauthenticated(f"invalid token: {exc}") from exc
        # exp is essential and numeric once validate() passed.
        claims = decoded.claims
        return Verified(self._principal(claims), float(claims["exp"]), keys_version)

    async def decode(self, token: str) -> jwt.Token:
        """Check ``token``'s form, algorithm and signature; its claims are not checked.

        The key is the JWKS's of the token's ``kid``; an unknown ``kid`` refreshes the
        set once (rate-limited). The console's OIDC sign-in checks id_tokens with this
        and its own claim rules (:mod:`app.auth.oidc`).

        Raises:
            Unauthenticated: malformed, algorithm not allowed, unknown key, bad signature.
            IdentityProviderUnavailable: the keys needed to check it cannot be loaded.
        """
        return (await self._decode(token))[0]

    async def _decode(self, token: str) -> tuple[jwt.Token, int]:
        # Also returns the key set's version, read right after the keys with no await
        # between, so it is the version of the set the signature was checked with.
        try:
            header = jws.extract_compact(token.encode("ascii")).headers()
        except (JoseError, ValueError, UnicodeError) as exc:
            raise Unauthenticated("invalid token: malformed") from exc
        alg = header.get("alg")
        if alg not in self.algorithms:
            raise Unauthenticated(f"invalid token: algorithm {alg!r} is not accepted")
        keys = await self.source.keys()
        version = self.source.version
        try:
            try:
                decoded = jwt.decode(
                    token, keys, algorithms=self.algorithms, registry=self._registry
                )
            except InvalidKeyIdError:
                keys = await self.source.keys(refresh=True)  # the provider rotated its keys
                version = self.source.version
                decoded = jwt.decode(
                    token, keys, algorithms=self.algorithms, registry=self._registry
                )
            return decoded, version
        except (JoseError, ValueError) as exc:
            raise Unauthenticated(f"invalid token: {exc}") from exc

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
