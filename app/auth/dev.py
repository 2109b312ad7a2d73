"""Dev-mode tokens: HS256 JWTs minted by ``treadle token`` (joserfc, RFC 7519).

For local use only. The secret is ``TREADLE_DEV_SECRET`` or, when unset, a random secret
generated once in ``<data_dir>/dev-secret`` (mode 0600) and shared by ``treadle dev``,
``treadle serve`` and ``treadle token`` on the same machine.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import OctKey

from app.auth.principal import Principal, Scope
from app.auth.token_cache import Verified
from app.core.errors import Unauthenticated
from app.core.ids import is_tenant_id
from app.core.settings import Settings

DEV_ISSUER = "treadle-dev"
DEV_AUDIENCE = "treadle"


def existing_dev_secret(settings: Settings) -> str | None:
    """Return the HS256 secret if one is configured or already on disk, else None.

    For ``treadle token``: unlike :func:`dev_secret` it never creates a secret, since a
    new one would sign tokens that a server using another data dir rejects.
    """
    if settings.dev_secret:
        return settings.dev_secret
    path = Path(settings.data_dir) / "dev-secret"
    return path.read_text().strip() if path.exists() else None


def dev_secret(settings: Settings) -> str:
    """Return the HS256 secret, creating ``<data_dir>/dev-secret`` on first use."""
    if settings.dev_secret:
        return settings.dev_secret
    path = Path(settings.data_dir) / "dev-secret"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    # O_EXCL: if two processes race, one creates and the other reads its secret.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(secret)
    return secret


class DevTokens:
    """Mint and verify dev tokens with one secret.

    Args:
        secret: the HS256 key (>= 32 characters).
    """

    def __init__(self, secret: str) -> None:
        self._key = OctKey.import_key(secret)
        self._claims = jwt.JWTClaimsRegistry(
            iss={"essential": True, "value": DEV_ISSUER},
            aud={"essential": True, "value": DEV_AUDIENCE},
            sub={"essential": True},
            exp={"essential": True},
        )

    def mint(
        self,
        *,
        tenant_id: str,
        subject: str,
        scopes: Iterable[Scope | str],
        groups: Iterable[str] = (),
        ttl_seconds: int = 86_400,
    ) -> str:
        """Return a signed token valid for ``ttl_seconds``.

        Raises:
            ValueError: an unknown scope or a malformed tenant id.
        """
        if not is_tenant_id(tenant_id):
            raise ValueError("tenant must be 1..128 characters of letters, digits, _ . -")
        scope_values = [Scope(s).value for s in scopes]
        now = int(time.time())
        claims = {
            "iss": DEV_ISSUER,
            "aud": DEV_AUDIENCE,
            "sub": subject,
            "tenant": tenant_id,
            "scope": " ".join(scope_values),
            "groups": list(groups),
            "iat": now,
            "exp": now + ttl_seconds,
        }
        return jwt.encode({"alg": "HS256", "typ": "JWT"}, claims, self._key)

    def verify(self, token: str) -> Principal:
        """Verify signature, issuer, audience and expiry; return the principal.

        Raises:
            Unauthenticated: anything wrong with the token (the detail says what).
        """
        return self.verified(token).principal

    def verified(self, token: str) -> Verified:
        """Verify as :meth:`verify` does; also return the token's ``exp`` (Unix seconds).

        Raises:
            Unauthenticated: anything wrong with the token (the detail says what).
        """
        try:
            decoded = jwt.decode(token, self._key, algorithms=["HS256"])
            self._claims.validate(decoded.claims)
        except (JoseError, ValueError) as exc:
            raise Unauthenticated(f"invalid token: {exc}") from exc
        claims = decoded.claims
        tenant = claims.get("tenant")
        if not is_tenant_id(tenant):
            raise Unauthenticated("invalid token: missing or malformed tenant claim")
        scope_text = claims.get("scope", "")
        scopes = frozenset(
            Scope(s) for s in str(scope_text).split() if s in Scope._value2member_map_
        )
        groups = claims.get("groups") or []
        principal = Principal(
            tenant_id=tenant,
            subject=str(claims["sub"]),
            scopes=scopes,
            groups=frozenset(str(g) for g in groups) if isinstance(groups, list) else frozenset(),
        )
        # exp is essential and numeric once validate() passed.
        return Verified(principal, float(claims["exp"]))
