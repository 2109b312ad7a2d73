"""One entry point from a bearer token to a :class:`Principal`, by auth mode."""

from __future__ import annotations

from app.auth.dev import DevTokens, dev_secret
from app.auth.jwt import JwtVerifier
from app.auth.principal import Principal
from app.core.settings import AuthMode, Settings


class Authenticator:
    """Verify bearer tokens the way ``TREADLE_AUTH_MODE`` says.

    ``dev``: HS256 tokens from ``treadle token``. ``jwt``: provider tokens checked against
    the JWKS (see :mod:`app.auth.jwt`).
    """

    def __init__(self, settings: Settings, jwt_verifier: JwtVerifier | None = None) -> None:
        self.mode = settings.auth_mode
        self._dev = DevTokens(dev_secret(settings)) if self.mode == AuthMode.DEV else None
        self._jwt = jwt_verifier or (JwtVerifier(settings) if self.mode == AuthMode.JWT else None)

    async def authenticate(self, token: str) -> Principal:
        """Return the token's principal.

        Raises:
            Unauthenticated: the token is not valid in this mode.
        """
        if self._jwt is not None:
            return await self._jwt.verify(token)
        assert self._dev is not None
        return self._dev.verify(token)
