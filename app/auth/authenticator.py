"""One entry point from a bearer token to a :class:`Principal`, by auth mode."""

from __future__ import annotations

from typing import Protocol

import structlog

from app.auth.api_keys import is_api_key
from app.auth.dev import DevTokens, dev_secret
from app.auth.jwt import JwtVerifier
from app.auth.principal import Principal
from app.auth.token_cache import TokenCache, Verified
from app.core.errors import AuthModeRequired, Unauthenticated
from app.core.settings import AuthMode, Settings

log = structlog.get_logger("treadle.auth")

INVALID_TOKEN = "invalid bearer token"
"""The one detail of every refused credential (401): it never says what was wrong."""


class ApiKeyVerifier(Protocol):
    """Looks up and checks an API key (implemented over the database by the engine)."""

    async def verify(self, token: str) -> Principal:
        """Return the key's principal (reading only).

        Raises:
            Unauthenticated: unknown, malformed or revoked key (the detail is for the
                log: the authenticator answers every refusal with one detail).
        """
        ...

    async def mark_used(self, principal: Principal) -> None:
        """Record that the key authenticated a request that was let in."""
        ...


class TenantGate(Protocol):
    """Refuses principals of suspended tenants (implemented by the engine's tenants).

    Attributes:
        generation: bumped by every suspend or resume made through this process.
    """

    generation: int

    async def ensure_active(self, principal: Principal) -> None:
        """Return if the principal may act.

        Raises:
            TenantSuspended: its tenant is suspended and it does not hold ``admin``.
        """
        ...


class Authenticator:
    """Verify bearer tokens the way ``TREADLE_AUTH_MODE`` says, then the tenant.

    ``dev``: HS256 tokens from ``treadle token``. ``jwt``: provider tokens checked against
    the JWKS (see :mod:`app.auth.jwt`). In every mode a token starting with ``trd_`` is a
    per-tenant API key, checked by ``api_keys``. A valid token of a suspended tenant is
    refused by ``tenants`` (403) before anything is written (not even an API key's
    ``last_used_at``).

    A token verified recently is not verified again: :attr:`cache` keeps verifications
    (never refusals) for ``TREADLE_AUTH_CACHE_TTL_SECONDS`` at most, never past the
    token's ``exp``, keyed by the token's hash (:mod:`app.auth.token_cache`). The tenant
    gate and an API key's ``last_used_at`` run on every request, cached or not.

    Dev mode outside the embedded SQLite database must be chosen explicitly
    (:meth:`Settings.dev_auth_refusal`).

    Args:
        settings: the auth mode and its parameters, and the cache's size and TTL.
        jwt_verifier: override the JWKS verifier (tests).
        api_keys: API key verifier; without one, API keys are refused.
        tenants: the suspended-tenant gate; without one, no tenant is refused.
        cache: the verified-token cache (shared with whatever revokes API keys in this
            process); default: a new one sized by settings.

    Raises:
        AuthModeRequired: dev mode by default on a database other than SQLite.
    """

    def __init__(
        self,
        settings: Settings,
        jwt_verifier: JwtVerifier | None = None,
        api_keys: ApiKeyVerifier | None = None,
        tenants: TenantGate | None = None,
        cache: TokenCache | None = None,
    ) -> None:
        refusal = settings.dev_auth_refusal()
        if refusal is not None:
            raise AuthModeRequired(refusal)
        self.mode = settings.auth_mode
        self._dev = DevTokens(dev_secret(settings)) if self.mode == AuthMode.DEV else None
        self._jwt = jwt_verifier or (JwtVerifier(settings) if self.mode == AuthMode.JWT else None)
        self._api_keys = api_keys
        self._tenants = tenants
        self._leeway = float(settings.jwt_leeway_seconds) if self._jwt is not None else 0.0
        # `is not None`: an empty cache is falsy (it has a length).
        self.cache = (
            cache
            if cache is not None
            else TokenCache(
                size=settings.auth_cache_size, ttl_seconds=settings.auth_cache_ttl_seconds
            )
        )

    @property
    def jwt_verifier(self) -> JwtVerifier | None:
        """The JWT verifier (jwt mode) whose key cache the console's OIDC sign-in shares."""
        return self._jwt

    def start(self) -> None:
        """Start the background JWKS refresh (jwt mode; call inside the running loop)."""
        if self._jwt is not None:
            self._jwt.source.start()

    async def aclose(self) -> None:
        """Stop the background JWKS refresh (idempotent)."""
        if self._jwt is not None:
            await self._jwt.source.aclose()

    @property
    def leeway_seconds(self) -> float:
        """Seconds past its ``exp`` a token of this mode is still accepted.

        ``TREADLE_JWT_LEEWAY_SECONDS`` in jwt mode; dev tokens get none. A token is
        refused from ``exp + leeway`` on (joserfc refuses ``exp <= now - leeway``).
        """
        return self._leeway

    @property
    def generation(self) -> tuple[int, int]:
        """Changes whenever this process revokes an API key or suspends or resumes a tenant.

        The cache's generation and the tenant gate's: a long-lived response that sees it
        change re-checks its credential at once (app/auth/credential_watch.py).
        """
        return (self.cache.generation, self._tenants.generation if self._tenants else 0)

    async def authenticate(self, token: str) -> Principal:
        """Return the token's principal, provided its tenant may act.

        See :meth:`authenticate_verified`, which this is.
        """
        return (await self.authenticate_verified(token)).principal

    async def authenticate_verified(self, token: str) -> Verified:
        """Return the token's verification (principal and ``exp``), provided its tenant may act.

        Every bad credential — a malformed, unknown, forged or revoked API key, a JWT
        that is malformed, expired, of another issuer or signed by an unknown key — is
        the same :data:`INVALID_TOKEN` 401, so a caller cannot probe which keys exist or
        were revoked (docs/security.md). Why it was refused goes to the log
        (``treadle.auth``, ``bearer token refused``, with ``reason``) only.

        Raises:
            Unauthenticated: the token is not valid in this mode (401, one detail).
            TenantSuspended: the token's tenant is suspended (403; ``admin`` is exempt).
            IdentityProviderUnavailable: jwt mode, the provider's keys cannot be loaded
                (503): the token may be valid, so this is no 401.
        """
        api_key = is_api_key(token)
        # A JWT verified against an older key set of the provider is verified again.
        keys_version = self._jwt.source.version if self._jwt is not None else None
        verified = self.cache.get_verified(token, keys_version=keys_version)
        if verified is None:
            generation = self.cache.generation
            try:
                verified = await self._verify(token, api_key=api_key)
            except Unauthenticated as exc:
                log.info(
                    "bearer token refused",
                    credential="api_key" if api_key else self.mode.value,
                    reason=exc.detail,
                )
                raise Unauthenticated(INVALID_TOKEN) from None
            self.cache.put(token, verified, generation=generation)
        await self._ensure_active(verified.principal)
        if api_key:
            assert self._api_keys is not None
            await self._api_keys.mark_used(verified.principal)
        return verified

    async def _verify(self, token: str, *, api_key: bool) -> Verified:
        if api_key:
            if self._api_keys is None:
                raise Unauthenticated("invalid token: API keys are not enabled")
            return Verified(await self._api_keys.verify(token))
        if self._jwt is not None:
            return await self._jwt.verified(token)
        assert self._dev is not None
        return self._dev.verified(token)

    async def _ensure_active(self, principal: Principal) -> None:
        if self._tenants is not None:
            await self._tenants.ensure_active(principal)
