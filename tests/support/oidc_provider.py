"""A small OpenID Connect provider for tests, served by uvicorn on a free 127.0.0.1 port.

It implements just what Treadle's jwt mode and console sign-in use, with the checks a real
provider makes: discovery (OpenID Connect Discovery 1.0), a JWKS with key rotation on
demand, an authorize endpoint that auto-approves one configured user and redirects back
with ``code`` and ``state`` (client id and redirect URI registered, PKCE S256 required),
and a token endpoint (RFC 6749 section 4.1.3) checking client credentials, the single-use
code, ``redirect_uri`` and the PKCE verifier (RFC 7636 section 4.6). Tokens are RS256 JWTs
signed with joserfc: an id_token (``aud`` = client id, ``nonce``) and an access token for
the API (``aud`` = the API audience, ``tenant``/``scope``/``groups`` as app.auth.jwt reads).
``down = True`` makes every endpoint answer 503 (the provider unreachable for the API).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode

import uvicorn
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.helpers import wait_for_sync


class UvicornThread:
    """Serve an ASGI app with uvicorn in a daemon thread on a free 127.0.0.1 port.

    The socket is bound before the server starts (no free-port race); ``url`` is
    ``http://127.0.0.1:<port>``. :meth:`stop` shuts the server down and joins the thread.
    """

    def __init__(self, app: Any) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = int(self._socket.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="auto", log_config=None)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def start(self) -> UvicornThread:
        """Start serving and return once uvicorn is accepting connections (90 s deadline)."""
        self._thread.start()
        wait_for_sync(
            lambda: self.server.started or not self._thread.is_alive(),
            timeout=90,
            what="uvicorn to start",
        )
        assert self.server.started, "uvicorn did not start (see the log above)"
        return self

    def stop(self) -> None:
        """Shut down (lifespan shutdown runs) and wait for the thread (30 s)."""
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self._socket.close()


@dataclass
class PendingCode:
    """An authorization code the provider issued and has not yet redeemed."""

    client_id: str
    redirect_uri: str
    code_challenge: str
    nonce: str | None
    scope: str


@dataclass
class OidcProvider:
    """The provider's configuration and state; :meth:`start` serves it.

    Attributes:
        client_id, client_secret, redirect_uris: the one registered client.
        api_audience: ``aud`` of the access tokens (the API's TREADLE_JWT_AUDIENCE).
        user: claims of the auto-approved user (``sub``, ``tenant``, ``scope``, ``groups``).
        down: answer 503 everywhere.
        token_requests: bodies the token endpoint received (for assertions).
    """

    client_id: str = "treadle-console"
    client_secret: str | None = "console-secret-0123456789"  # None: a public client
    redirect_uris: list[str] = field(default_factory=list)
    api_audience: str = "treadle-api"
    user: dict[str, Any] = field(
        default_factory=lambda: {
            "sub": "alice",
            "tenant": "acme",
            "scope": "runs:read runs:write",
            "groups": ["sales-manager"],
            "name": "Alice Example",
        }
    )
    down: bool = False
    access_token_audience: str | None = None  # override aud of access tokens (tests)
    keys: list[RSAKey] = field(default_factory=list)
    codes: dict[str, PendingCode] = field(default_factory=dict)
    token_requests: list[dict[str, str]] = field(default_factory=list)
    jwks_fetches: int = 0
    _server: UvicornThread | None = None

    def __post_init__(self) -> None:
        if not self.keys:
            self.rotate()

    # -- keys and tokens ---------------------------------------------------------------

    @property
    def signing_key(self) -> RSAKey:
        """The newest key: tokens are signed with it."""
        return self.keys[-1]

    def rotate(self, *, drop_old: bool = False) -> RSAKey:
        """Add a fresh RS256 key and sign with it; ``drop_old`` removes the others."""
        kid = f"key-{len(self.keys) + 1}-{secrets.token_hex(4)}"
        key = RSAKey.generate_key(2048, parameters={"kid": kid, "alg": "RS256", "use": "sig"})
        self.keys = [key] if drop_old else [*self.keys, key]
        return key

    @property
    def issuer(self) -> str:
        """The issuer URL (the server's base URL): its discovery path is below it."""
        assert self._server is not None, "start() the provider first"
        return self._server.url

    def token(self, key: RSAKey | None = None, **claims: Any) -> str:
        """An RS256 access token for the API, valid 5 minutes.

        The user's claims, ``claims`` overriding (``None`` removes a claim), signed by
        ``key`` (default: the newest).
        """
        now = int(time.time())
        body: dict[str, Any] = {
            **self.user,
            "iss": self.issuer,
            "aud": self.access_token_audience or self.api_audience,
            "iat": now,
            "nbf": now,
            "exp": now + 300,
        }
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return self._sign(key or self.signing_key, body)

    def id_token(self, nonce: str | None, access_token: str, **claims: Any) -> str:
        """An id_token for the client (``aud`` = client id), with ``nonce`` and ``at_hash``."""
        now = int(time.time())
        digest = hashlib.sha256(access_token.encode()).digest()
        body: dict[str, Any] = {
            "iss": self.issuer,
            "aud": self.client_id,
            "sub": self.user["sub"],
            "name": self.user.get("name"),
            "iat": now,
            "exp": now + 300,
            "at_hash": base64.urlsafe_b64encode(digest[:16]).rstrip(b"=").decode(),
            **({"nonce": nonce} if nonce is not None else {}),
        }
        body.update(claims)
        return self._sign(self.signing_key, {k: v for k, v in body.items() if v is not None})

    @staticmethod
    def _sign(key: RSAKey, body: dict[str, Any]) -> str:
        header = {"alg": "RS256", "typ": "JWT", "kid": key.kid}
        return jwt.encode(header, body, key, algorithms=["RS256"])

    # -- HTTP ------------------------------------------------------------------------

    def start(self) -> OidcProvider:
        """Serve on a free 127.0.0.1 port (returns once it accepts connections)."""
        self._server = UvicornThread(self.app()).start()
        return self

    def stop(self) -> None:
        """Stop serving (the port then refuses connections)."""
        if self._server is not None:
            self._server.stop()

    def app(self) -> Starlette:
        """The provider's ASGI app."""

        def unavailable() -> Response | None:
            return Response(status_code=503) if self.down else None

        async def discovery(_: Request) -> Response:
            if (down := unavailable()) is not None:
                return down
            base = self.issuer
            return JSONResponse(
                {
                    "issuer": base,
                    "authorization_endpoint": f"{base}/authorize",
                    "token_endpoint": f"{base}/token",
                    "jwks_uri": f"{base}/jwks",
                    "response_types_supported": ["code"],
                    "subject_types_supported": ["public"],
                    "id_token_signing_alg_values_supported": ["RS256"],
                    "code_challenge_methods_supported": ["S256"],
                    "token_endpoint_auth_methods_supported": [
                        "client_secret_basic",
                        "client_secret_post",
                    ],
                }
            )

        async def jwks(_: Request) -> Response:
            if (down := unavailable()) is not None:
                return down
            self.jwks_fetches += 1
            return JSONResponse(KeySet(list(self.keys)).as_dict(private=False))

        async def authorize(request: Request) -> Response:
            if (down := unavailable()) is not None:
                return down
            q = request.query_params
            if q.get("client_id") != self.client_id:
                return JSONResponse({"error": "unauthorized_client"}, status_code=400)
            redirect_uri = q.get("redirect_uri", "")
            if redirect_uri not in self.redirect_uris:
                # Never redirect to an unregistered URI (RFC 6749 section 4.1.2.1).
                return JSONResponse({"error": "invalid_redirect_uri"}, status_code=400)
            state = q.get("state")

            def back(**params: str) -> Response:
                if state is not None:
                    params["state"] = state
                return RedirectResponse(f"{redirect_uri}?{urlencode(params)}", status_code=302)

            if q.get("response_type") != "code":
                return back(error="unsupported_response_type")
            if "openid" not in q.get("scope", "").split():
                return back(error="invalid_scope", error_description="openid is required")
            if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
                return back(error="invalid_request", error_description="PKCE S256 required")
            code = secrets.token_urlsafe(24)
            self.codes[code] = PendingCode(
                client_id=self.client_id,
                redirect_uri=redirect_uri,
                code_challenge=q["code_challenge"],
                nonce=q.get("nonce"),
                scope=q.get("scope", ""),
            )
            return back(code=code)

        async def token(request: Request) -> Response:
            if (down := unavailable()) is not None:
                return down
            # application/x-www-form-urlencoded (RFC 6749 section 4.1.3), parsed by hand:
            # Starlette's form parser needs python-multipart, which Treadle does not ship.
            form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
            self.token_requests.append(form)
            client_id, secret = _client_credentials(request, form)
            if self.client_secret is None:
                # A public client (RFC 6749 section 2.1): no secret, the verifier binds it.
                if client_id != self.client_id or secret:
                    return _token_error("invalid_client", status=401)
            elif client_id != self.client_id or not secrets.compare_digest(
                secret or "", self.client_secret
            ):
                return _token_error("invalid_client", status=401)
            if form.get("grant_type") != "authorization_code":
                return _token_error("unsupported_grant_type")
            pending = self.codes.pop(form.get("code", ""), None)  # single use
            if pending is None or pending.client_id != client_id:
                return _token_error("invalid_grant", "unknown or used code")
            if form.get("redirect_uri") != pending.redirect_uri:
                return _token_error("invalid_grant", "redirect_uri differs")
            verifier = form.get("code_verifier", "")
            challenge = (
                base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
                .rstrip(b"=")
                .decode()
            )
            if not verifier or not secrets.compare_digest(challenge, pending.code_challenge):
                return _token_error("invalid_grant", "PKCE verifier does not match")
            access = self.token()
            return JSONResponse(
                {
                    "access_token": access,
                    "token_type": "Bearer",
                    "expires_in": 300,
                    "scope": pending.scope,
                    "id_token": self.id_token(pending.nonce, access),
                },
                headers={"Cache-Control": "no-store"},
            )

        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", discovery),
                Route("/jwks", jwks),
                Route("/authorize", authorize),
                Route("/token", token, methods=["POST"]),
            ]
        )


def _client_credentials(request: Request, form: dict[str, str]) -> tuple[str | None, str | None]:
    """client_secret_basic (RFC 6749 section 2.3.1), else client_secret_post."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("basic "):
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return unquote(user), unquote(password)
    return form.get("client_id"), form.get("client_secret")


def _token_error(error: str, description: str = "", status: int = 400) -> Response:
    return JSONResponse({"error": error, "error_description": description}, status_code=status)
