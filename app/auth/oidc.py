"""The console's OpenID Connect sign-in: the authorization-code flow with PKCE, via authlib.

:class:`OidcSignIn` is the client; the console's two routes call it (ADR 0018)::

    # GET /ui/login/oidc
    url, cookie = await oidc.begin(oidc.redirect_url(external_base))
    response = RedirectResponse(url, 303)
    # STATE_COOKIE, HttpOnly, SameSite=Lax; __Host-, Secure, Path=/ on https
    STATE.set(request, response, cookie, max_age=STATE_TTL_SECONDS)

    # GET /ui/login/oidc/callback
    try:
        login = await oidc.complete(request.query_params, STATE.read(request))
    except OidcError as exc:  # str(exc) is safe to show on the login page (status 401)
        ...
    await start_session(request, response, login.token)
    STATE.clear(request, response)  # one sign-in, one cookie

``oidc`` is ``request.app.state.oidc_sign_in`` (None: no OIDC configured, no link shown;
its ``provider_name`` names the link).

Rules: OAuth 2.0 (RFC 6749) authorization code grant with PKCE S256 (RFC 7636) and
``state``; OpenID Connect Core 1.0 section 3.1.3.7 for the id_token (signature by the
provider's JWKS, ``iss`` the issuer, ``aud`` the client id, ``azp``, ``nonce`` the one sent,
``exp``/``iat``, ``at_hash`` when present). The provider's endpoints come from its discovery
document and its keys from the same cache as the API's jwt mode (:class:`JwksSource`).

The token the console keeps is the first the API itself accepts: the access token when the
provider issues JWT access tokens for the API's audience (``TREADLE_JWT_AUDIENCE``) with the
tenant claim, else the id_token when the API's audience is the client id. If neither is
accepted, sign-in fails with :class:`OidcTokenError` saying so (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from authlib.common.errors import AuthlibBaseError
from authlib.oidc.core import CodeIDToken
from joserfc import jwe, jwt
from joserfc.errors import JoseError
from joserfc.jwk import OctKey

from app.auth.jwt import AsyncOAuth2Client, JwtVerifier
from app.auth.principal import Principal
from app.core.errors import IdentityProviderUnavailable, Unauthenticated
from app.core.settings import Settings

STATE_COOKIE = "treadle_oidc"
"""Name of the short-lived cookie that carries one sign-in's state, nonce and verifier.

On https the console names it ``__Host-treadle_oidc`` (``app.console.oidc_pages.STATE``).
"""

STATE_TTL_SECONDS = 600
"""How long a sign-in may take between :meth:`OidcSignIn.begin` and ``complete`` (s)."""

CALLBACK_PATH = "/ui/login/oidc/callback"
"""The console's callback path: the default redirect URL is the external base plus this."""

# The state cookie is an encrypted JWT (JWE, direct key, AES-256-GCM): the browser keeps it
# but can neither read the PKCE verifier nor change a field without the key.
_COOKIE_HEADER = {"alg": "dir", "enc": "A256GCM"}
_COOKIE_REGISTRY = jwe.JWERegistry(algorithms=["dir", "A256GCM"])


class OidcError(Exception):
    """Sign-in failed; ``str(error)`` is safe to show to the user (no secrets in it)."""


class OidcStateError(OidcError):
    """The callback does not belong to a sign-in begun here.

    No, expired or forged state cookie, or ``state`` differs from it (a CSRF or a stale
    tab; RFC 6749 section 10.12).
    """


class OidcProviderError(OidcError):
    """The provider refused (``error`` on the callback, token endpoint error) or is down."""


class OidcTokenError(OidcError):
    """The id_token is invalid, or the API accepts none of the provider's tokens.

    Invalid: signature, issuer, audience, ``azp``, nonce, expiry or ``at_hash``.
    """


@dataclass(frozen=True)
class OidcLogin:
    """A completed sign-in.

    Attributes:
        token: what the console keeps and sends as ``Authorization: Bearer`` (accepted by
            the API's jwt mode when returned).
        token_kind: ``"access_token"`` or ``"id_token"``: which of the provider's tokens.
        subject: the id_token's ``sub`` (the person, as the provider names them).
        principal: what the API makes of ``token`` (tenant, subject, scopes, groups).
        id_token_claims: the validated id_token's claims (``name``, ``email``... if any).
        return_to: what :meth:`OidcSignIn.begin` was given as ``return_to`` ("" if none);
            it came back inside the encrypted state cookie, so the browser could not
            change it, but the caller validates it again before following it.
    """

    token: str
    token_kind: Literal["access_token", "id_token"]
    subject: str
    principal: Principal
    id_token_claims: dict[str, Any]
    return_to: str = ""


class OidcSignIn:
    """Authorization-code sign-in against ``TREADLE_OIDC_ISSUER`` for the console.

    Args:
        settings: ``oidc_*`` settings (client id required) and the jwt mode's.
        verifier: the API's JWT verifier (``Authenticator.jwt_verifier``): its key cache
            checks the id_token and it decides which token the API accepts.
        cookie_secret: key material of the state cookie; pass the console's secret
            (``TREADLE_CONSOLE_SECRET``) so every API process can read the cookie another
            set. Default: ``TREADLE_OIDC_CLIENT_SECRET`` (shared by every process, known
            only to them and the provider, which is trusted with identities anyway), else
            random per process (a public client behind one process only).
    """

    def __init__(
        self,
        settings: Settings,
        verifier: JwtVerifier,
        *,
        cookie_secret: str | bytes | None = None,
    ) -> None:
        if not (settings.oidc_issuer and settings.oidc_client_id):
            raise ValueError("OIDC sign-in needs TREADLE_OIDC_ISSUER and TREADLE_OIDC_CLIENT_ID")
        self.settings = settings
        self.issuer = settings.oidc_issuer
        self.client_id = settings.oidc_client_id
        self.provider_name = settings.oidc_provider_name
        self._verifier = verifier
        scopes = list(settings.oidc_scopes)
        self._scope = " ".join(["openid", *[s for s in scopes if s != "openid"]])
        secret = cookie_secret or settings.oidc_client_secret or secrets.token_bytes(32)
        raw = secret.encode() if isinstance(secret, str) else secret
        # A key of its own for this cookie, so the console's secret is never used raw.
        self._cookie_key = OctKey.import_key(
            hashlib.sha256(b"treadle oidc state cookie\x00" + raw).digest()
        )

    def redirect_url(self, external_base: str) -> str:
        """The redirect URL to send to the provider (absolute).

        ``TREADLE_OIDC_REDIRECT_URL``, else ``external_base`` (e.g.
        ``https://treadle.example.com``) + :data:`CALLBACK_PATH`.
        """
        return self.settings.oidc_redirect_url or external_base.rstrip("/") + CALLBACK_PATH

    async def begin(self, redirect_url: str, return_to: str = "") -> tuple[str, str]:
        """Start a sign-in: the provider URL to redirect to, and the state cookie's value.

        The URL carries ``response_type=code``, the client id, scopes, ``redirect_uri``,
        fresh ``state`` and ``nonce`` and a PKCE S256 ``code_challenge``; the cookie value
        (encrypted, valid :data:`STATE_TTL_SECONDS`) keeps state, nonce, verifier,
        redirect URL and ``return_to`` (the caller's opaque "where to go afterwards", the
        console's validated page path, returned as :attr:`OidcLogin.return_to`) for
        :meth:`complete`. Set it HttpOnly, SameSite=Lax.

        Raises:
            OidcProviderError: the provider's discovery document cannot be read.
        """
        metadata = await self._metadata()
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        code_verifier = secrets.token_urlsafe(48)  # 64 characters (RFC 7636: 43 to 128)
        client = self._oauth_client(redirect_url)
        url, _ = client.create_authorization_url(
            metadata["authorization_endpoint"],
            state=state,
            nonce=nonce,
            code_verifier=code_verifier,
        )
        now = int(time.time())
        cookie = jwt.encode(
            _COOKIE_HEADER,
            {
                "state": state,
                "nonce": nonce,
                "code_verifier": code_verifier,
                "redirect_uri": redirect_url,
                "return_to": return_to,
                "iat": now,
                "exp": now + STATE_TTL_SECONDS,
            },
            self._cookie_key,
            registry=_COOKIE_REGISTRY,
        )
        return str(url), cookie

    async def complete(
        self, query_params: Mapping[str, str], state_cookie_value: str | None
    ) -> OidcLogin:
        """Finish a sign-in from the callback's query and the state cookie.

        Checks ``state`` against the cookie, exchanges ``code`` at the token endpoint (with
        the PKCE verifier and client credentials), validates the id_token and picks the
        token the API accepts (module docstring).

        Raises:
            OidcStateError: missing, expired or forged cookie; ``state`` absent or unequal.
            OidcProviderError: the callback carries ``error``, no ``code``, the token
                endpoint refuses (a wrong PKCE verifier, a used code) or is unreachable.
            OidcTokenError: the id_token is missing or invalid, or no token is accepted.
        """
        saved = self._read_cookie(state_cookie_value)
        state = query_params.get("state")
        if not state or not hmac.compare_digest(state.encode(), str(saved["state"]).encode()):
            raise OidcStateError("the sign-in state does not match; start the sign-in again")
        if error := query_params.get("error"):
            description = query_params.get("error_description") or ""
            raise OidcProviderError(f"the identity provider refused: {error} {description}")
        code = query_params.get("code")
        if not code:
            raise OidcProviderError("the identity provider's answer has no authorization code")
        tokens = await self._exchange(code, saved)
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            raise OidcTokenError("the identity provider returned no id_token")
        access_token = tokens.get("access_token")
        claims = await self._validate_id_token(
            id_token, str(saved["nonce"]), access_token if isinstance(access_token, str) else None
        )
        candidates: list[tuple[Literal["access_token", "id_token"], str]] = [("id_token", id_token)]
        if isinstance(access_token, str):
            candidates.insert(0, ("access_token", access_token))
        for kind, token in candidates:
            try:
                principal = await self._verifier.verify(token)
            except Unauthenticated:
                continue
            except IdentityProviderUnavailable as exc:
                raise OidcProviderError(str(exc.detail)) from None
            return OidcLogin(
                token=token,
                token_kind=kind,
                subject=str(claims["sub"]),
                principal=principal,
                id_token_claims=claims,
                return_to=str(saved.get("return_to") or ""),
            )
        raise OidcTokenError(
            "signed in at the identity provider, but Treadle's API accepts none of its "
            "tokens: the access token (or id_token) must carry the audience "
            f"{self.settings.jwt_audience!r} and the {self.settings.jwt_tenant_claim!r} claim"
        )

    async def _metadata(self) -> dict[str, Any]:
        try:
            return await self._verifier.source.metadata()
        except IdentityProviderUnavailable as exc:
            raise OidcProviderError(str(exc.detail)) from None

    def _oauth_client(self, redirect_url: str) -> Any:
        return AsyncOAuth2Client(
            client_id=self.client_id,
            client_secret=self.settings.oidc_client_secret,
            # Without a secret the client is public (RFC 6749 section 2.1): PKCE only.
            token_endpoint_auth_method=(
                "client_secret_basic" if self.settings.oidc_client_secret else "none"
            ),
            scope=self._scope,
            redirect_uri=redirect_url,
            code_challenge_method="S256",
            timeout=5.0,
        )

    def _read_cookie(self, value: str | None) -> dict[str, Any]:
        if not value:
            raise OidcStateError("no sign-in in progress (the state cookie is missing)")
        try:
            token = jwt.decode(value, self._cookie_key, registry=_COOKIE_REGISTRY)
            jwt.JWTClaimsRegistry(exp={"essential": True}).validate(token.claims)
        except (JoseError, ValueError) as exc:
            raise OidcStateError(
                "the sign-in expired or its state cookie is invalid; start the sign-in again"
            ) from exc
        return token.claims

    async def _exchange(self, code: str, saved: Mapping[str, Any]) -> dict[str, Any]:
        metadata = await self._metadata()
        client = self._oauth_client(str(saved["redirect_uri"]))
        try:
            async with client:
                token = await client.fetch_token(
                    metadata["token_endpoint"],
                    grant_type="authorization_code",
                    code=code,
                    code_verifier=saved["code_verifier"],
                    redirect_uri=saved["redirect_uri"],
                )
        except AuthlibBaseError as exc:
            raise OidcProviderError(
                f"the identity provider refused the code: {exc.error} {exc.description or ''}"
            ) from None
        except (httpx.HTTPError, ValueError) as exc:
            raise OidcProviderError(
                f"the identity provider's token endpoint failed: {type(exc).__name__}"
            ) from None
        return dict(token)

    async def _validate_id_token(
        self, id_token: str, nonce: str, access_token: str | None
    ) -> dict[str, Any]:
        try:
            decoded = await self._verifier.decode(id_token)
        except Unauthenticated as exc:
            raise OidcTokenError(f"the id_token is invalid: {exc.detail}") from None
        except IdentityProviderUnavailable as exc:
            raise OidcProviderError(str(exc.detail)) from None
        params: dict[str, Any] = {"nonce": nonce, "client_id": self.client_id}
        if access_token:
            params["access_token"] = access_token
        claims = CodeIDToken(
            decoded.claims,
            decoded.header,
            {
                "iss": {"essential": True, "value": self.issuer},
                "aud": {"essential": True, "value": self.client_id},
            },
            params,
        )
        try:
            claims.validate(leeway=self.settings.jwt_leeway_seconds)
        except (JoseError, AuthlibBaseError, ValueError) as exc:
            raise OidcTokenError(f"the id_token is invalid: {exc}") from None
        return dict(claims)
