"""One entry point from a bearer token to a :class:`Principal`, by auth mode."""

from __future__ import annotations

from typing import Protocol

from app.auth.api_keys import is_api_key
from app.auth.dev import DevTokens, dev_secret
from app.auth.jwt import JwtVerifier
from app.auth.principal import Principal
from app.core.errors import Unauthenticated
from app.core.settings import AuthMode, Settings


class ApiKeyVerifier(Protocol):
    """Looks up and checks an API key (implemented over the database by the engine)."""

    async def verify(self, token: str) -> Principal:
        """Return the key's principal.

        Raises:
            Unauthenticated: unknown, malformed or revoked key.
        """
        ...


class Authenticator:
    """Verify bearer tokens the way ``TREADLE_AUTH_MODE`` says.

    ``dev``: HS256 tokens from ``treadle token``. ``jwt``: provider tokens checked against
    the JWKS (see :mod:`app.auth.jwt`). In every mode a token starting with ``trd_`` is a
    per-tenant API key, checked by ``api_keys``.

    Args:
        settings: the auth mode and its parameters.
        jwt_verifier: override the JWKS verifier (tests).
        api_keys: API key verifier; without one, API keys are refused.
    """

    def __init__(
        self,
        settings: Settings,
        jwt_verifier: JwtVerifier | None = None,
        api_keys: ApiKeyVerifier | None = None,
    ) -> None:
        self.mode = settings.auth_mode
        self._dev = DevTokens(dev_secret(settings)) if self.mode == AuthMode.DEV else None
        self._jwt = jwt_verifier or (JwtVerifier(settings) if self.mode == AuthMode.JWT else None)
        self._api_keys = api_keys

    async def authenticate(self, token: str) -> Principal:
        """Return the token's principal.

        Raises:
            Unauthenticated: the token is not valid in this mode.
        """
        if is_api_key(token):
            if self._api_keys is None:
                raise Unauthenticated("invalid token: API keys are not enabled")
            return await self._api_keys.verify(token)
        if self._jwt is not None:
            return await self._jwt.verify(token)
        assert self._dev is not None
        return self._dev.verify(token)
