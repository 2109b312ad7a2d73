"""OIDC discovery, JWKS refresh and the console's code-flow sign-in, over real HTTP.

The provider is tests/support/oidc_provider.py under uvicorn on 127.0.0.1; the API runs
under uvicorn too (jwt mode with TREADLE_OIDC_ISSUER, on SQLite and PostgreSQL).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from joserfc.jwk import RSAKey

from app.api.app import create_app
from app.auth.jwt import JwtVerifier
from app.auth.oidc import (
    CALLBACK_PATH,
    OidcLogin,
    OidcProviderError,
    OidcSignIn,
    OidcStateError,
    OidcTokenError,
)
from app.core.settings import AuthMode, Settings
from tests.conftest import make_settings
from tests.helpers import wait_for
from tests.support.oidc_provider import OidcProvider, UvicornThread

REDIRECT = "http://127.0.0.1:9/ui/login/oidc/callback"  # never fetched: the test reads it


@pytest.fixture
def provider() -> Iterator[OidcProvider]:
    idp = OidcProvider(redirect_uris=[REDIRECT]).start()
    yield idp
    idp.stop()


def jwt_settings(database_url: str, tmp_path: Path, issuer: str, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "auth_mode": AuthMode.JWT,
        "oidc_issuer": issuer,
        "jwt_audience": "treadle-api",
        "jwt_leeway_seconds": 5,
        "jwks_refresh_min_seconds": 0,
        "jwks_refresh_interval_seconds": 0,
        **extra,
    }
    return make_settings(database_url, tmp_path, **values)


class Api:
    """The API under uvicorn in a thread; ``get`` calls ``/runs`` with a bearer token."""

    def __init__(self, settings: Settings) -> None:
        self.server = UvicornThread(create_app(settings)).start()

    async def get(self, token: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.server.url, timeout=30) as client:
            return await client.get("/runs", headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def start_api(database_url: str, tmp_path: Path) -> Iterator[Any]:
    servers: list[Api] = []

    def start(issuer: str, **extra: Any) -> Api:
        api = Api(jwt_settings(database_url, tmp_path, issuer, **extra))
        servers.append(api)
        return api

    yield start
    for api in servers:
        api.server.stop()


async def test_a_token_of_the_discovered_issuer_is_accepted(
    provider: OidcProvider, start_api: Any
) -> None:
    api = start_api(provider.issuer)
    response = await api.get(provider.token())
    assert response.status_code == 200, response.text
    assert provider.jwks_fetches >= 1  # the keys came from the discovered jwks_uri


async def test_an_unknown_kid_refreshes_the_keys(provider: OidcProvider, start_api: Any) -> None:
    api = start_api(provider.issuer)
    old = provider.token()
    assert (await api.get(old)).status_code == 200
    provider.rotate(drop_old=True)
    assert (await api.get(provider.token())).status_code == 200  # new kid: refreshed
    # The old key left the provider's set with that refresh: its tokens are refused now.
    assert (await api.get(old)).status_code == 401


async def test_the_scheduled_refresh_picks_up_a_rotated_key(
    provider: OidcProvider, start_api: Any
) -> None:
    # Unknown-kid refreshes are rate-limited away for an hour: only the schedule can help.
    api = start_api(
        provider.issuer, jwks_refresh_min_seconds=3600, jwks_refresh_interval_seconds=0.5
    )
    assert (await api.get(provider.token())).status_code == 200
    fetches = provider.jwks_fetches
    provider.rotate()
    fresh = provider.token()

    async def accepted() -> bool:
        return bool((await api.get(fresh)).status_code == 200)

    await wait_for(accepted, timeout=60, interval=0.2, what="the scheduled JWKS refresh")
    assert provider.jwks_fetches > fetches


async def test_provider_down_is_503_until_keys_load_then_last_good_keys_serve(
    provider: OidcProvider, start_api: Any
) -> None:
    provider.down = True
    api = start_api(provider.issuer)
    token = provider.token()
    refused = await api.get(token)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"].isdigit()
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["code"] == "identity_provider_unavailable"

    provider.down = False

    async def accepted() -> bool:
        return bool((await api.get(token)).status_code == 200)

    # A failed first load is retried at most once a second.
    await wait_for(accepted, timeout=60, interval=0.2, what="the keys to load")

    provider.down = True
    assert (await api.get(token)).status_code == 200  # last good keys
    # A token of a key only the (down) provider knows: maybe valid, so 503, not 401.
    provider.rotate()
    unknown = await api.get(provider.token())
    assert unknown.status_code == 503
    assert "retry-after" in unknown.headers


async def test_an_unreachable_issuer_is_503_with_retry_after(
    database_url: str, tmp_path: Path
) -> None:
    idp = OidcProvider(redirect_uris=[REDIRECT]).start()
    issuer, token = idp.issuer, idp.token()
    idp.stop()  # nothing listens on the issuer's port any more
    api = Api(jwt_settings(database_url, tmp_path, issuer))
    try:
        response = await api.get(token)
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"].isdigit()
    finally:
        api.server.stop()


async def test_wrong_issuer_audience_expired_or_forged_tokens_are_401(
    provider: OidcProvider, start_api: Any
) -> None:
    api = start_api(provider.issuer)
    assert (await api.get(provider.token())).status_code == 200
    now = int(time.time())
    forger = RSAKey.generate_key(2048, parameters={"kid": str(provider.signing_key.kid)})
    bad = {
        "wrong issuer": provider.token(iss="https://evil.example/"),
        "wrong audience": provider.token(aud="someone-else"),
        "expired": provider.token(iat=now - 3600, nbf=now - 3600, exp=now - 600),
        "forged (same kid, other key)": provider.token(key=forger),
        "no tenant": provider.token(tenant=None),
    }
    for what, token in bad.items():
        response = await api.get(token)
        assert response.status_code == 401, what
        assert response.json()["detail"] == "invalid bearer token", what


# -- the console's sign-in (authorization code + PKCE) ---------------------------------


def sign_in_for(provider: OidcProvider, secret: str = "s" * 32, **extra: Any) -> OidcSignIn:
    values: dict[str, Any] = {
        "database_url": "sqlite+aiosqlite:///:memory:",
        "auth_mode": AuthMode.JWT,
        "oidc_issuer": provider.issuer,
        "jwt_audience": "treadle-api",
        "jwt_leeway_seconds": 5,
        "jwks_refresh_min_seconds": 0,
        "oidc_client_id": provider.client_id,
        "oidc_client_secret": provider.client_secret,
        **extra,
    }
    settings = Settings(**values)
    return OidcSignIn(settings, JwtVerifier(settings), cookie_secret=secret)


async def authorize(url: str) -> dict[str, str]:
    """Follow the provider's authorize URL (auto-approved) to its redirect's query."""
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.get(url, follow_redirects=False)
    assert response.status_code == 302, response.text
    location = response.headers["location"]
    assert location.startswith(REDIRECT + "?")
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()} | params
    return urlunsplit(parts._replace(query=urlencode(query)))


async def test_sign_in_end_to_end_gives_a_token_the_api_accepts(
    provider: OidcProvider, start_api: Any
) -> None:
    oidc = sign_in_for(provider)
    assert oidc.redirect_url("http://127.0.0.1:9/") == REDIRECT
    url, cookie = await oidc.begin(REDIRECT)
    q = parse_qs(urlsplit(url).query)
    assert q["response_type"] == ["code"] and q["client_id"] == [provider.client_id]
    assert q["code_challenge_method"] == ["S256"] and len(q["code_challenge"][0]) == 43
    assert q["redirect_uri"] == [REDIRECT] and "openid" in q["scope"][0].split()
    assert q["state"][0] and q["nonce"][0]
    assert q["state"][0] not in cookie and "code_verifier" not in cookie  # encrypted

    login = await oidc.complete(await authorize(url), cookie)
    assert isinstance(login, OidcLogin)
    assert login.token_kind == "access_token"
    assert login.subject == "alice" and login.principal.tenant_id == "acme"
    assert login.id_token_claims["name"] == "Alice Example"
    exchange = provider.token_requests[-1]
    assert exchange["code_verifier"] and exchange["redirect_uri"] == REDIRECT

    api = start_api(provider.issuer)
    assert (await api.get(login.token)).status_code == 200


async def test_a_state_mismatch_or_bad_cookie_is_refused(provider: OidcProvider) -> None:
    oidc = sign_in_for(provider)
    url, cookie = await oidc.begin(REDIRECT)
    query = await authorize(url)
    with pytest.raises(OidcStateError, match="state does not match"):
        await oidc.complete({**query, "state": "someone-elses"}, cookie)
    with pytest.raises(OidcStateError, match="state does not match"):
        await oidc.complete({"code": query["code"]}, cookie)
    with pytest.raises(OidcStateError, match="cookie is missing"):
        await oidc.complete(query, None)
    with pytest.raises(OidcStateError, match="invalid"):
        await oidc.complete(query, cookie[:-4] + "AAAA")
    other = sign_in_for(provider, secret="t" * 32)  # another secret: cannot read this cookie
    with pytest.raises(OidcStateError, match="invalid"):
        await other.complete(query, cookie)
    assert provider.token_requests == []  # no code was spent on a refused callback
    assert (await oidc.complete(query, cookie)).subject == "alice"


async def test_a_nonce_mismatch_is_refused(provider: OidcProvider) -> None:
    oidc = sign_in_for(provider)
    url, cookie = await oidc.begin(REDIRECT)
    # An attacker's nonce in the request: the id_token carries it, not ours.
    query = await authorize(with_query(url, nonce="attacker-nonce"))
    with pytest.raises(OidcTokenError, match="nonce"):
        await oidc.complete(query, cookie)


async def test_the_provider_enforces_the_pkce_verifier(provider: OidcProvider) -> None:
    oidc = sign_in_for(provider)
    url_a, _cookie_a = await oidc.begin(REDIRECT)
    url_b, cookie_b = await oidc.begin(REDIRECT)
    # A code obtained for sign-in A, injected into sign-in B (B's state, B's verifier).
    query = await authorize(url_a)
    state_b = parse_qs(urlsplit(url_b).query)["state"][0]
    with pytest.raises(OidcProviderError, match="invalid_grant"):
        await oidc.complete({**query, "state": state_b}, cookie_b)
    # And without any verifier, straight at the token endpoint.
    query = await authorize(url_a)
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{provider.issuer}/token",
            data={
                "grant_type": "authorization_code",
                "code": query["code"],
                "redirect_uri": REDIRECT,
            },
            auth=(provider.client_id, provider.client_secret or ""),
        )
    assert response.status_code == 400 and response.json()["error"] == "invalid_grant"


async def test_provider_errors_and_a_reused_code_are_refused(provider: OidcProvider) -> None:
    oidc = sign_in_for(provider)
    url, cookie = await oidc.begin(REDIRECT)
    query = await authorize(url)
    with pytest.raises(OidcProviderError, match="access_denied"):
        await oidc.complete({"state": query["state"], "error": "access_denied"}, cookie)
    await oidc.complete(query, cookie)
    with pytest.raises(OidcProviderError, match="invalid_grant"):
        await oidc.complete(query, cookie)  # codes are single use
    provider.client_secret = "rotated-secret-elsewhere"
    url, cookie = await oidc.begin(REDIRECT)
    with pytest.raises(OidcProviderError, match="invalid_client"):
        await oidc.complete(await authorize(url), cookie)


async def test_tokens_the_api_would_refuse_fail_the_sign_in(provider: OidcProvider) -> None:
    provider.access_token_audience = "not-treadle"
    oidc = sign_in_for(provider)
    url, cookie = await oidc.begin(REDIRECT)
    with pytest.raises(OidcTokenError, match="accepts none of its tokens"):
        await oidc.complete(await authorize(url), cookie)


async def test_the_id_token_is_kept_when_the_api_audience_is_the_client_id(
    provider: OidcProvider,
) -> None:
    # Providers without JWT access tokens: the API's audience is the console's client id,
    # and the id_token carries the tenant claim.
    provider.access_token_audience = "not-treadle"
    oidc = sign_in_for(provider, jwt_audience=provider.client_id)
    url, cookie = await oidc.begin(REDIRECT)
    query = await authorize(url)
    original = provider.id_token

    def id_token_with_tenant(nonce: str | None, access_token: str, **claims: Any) -> str:
        return original(nonce, access_token, tenant="acme", **claims)

    provider.id_token = id_token_with_tenant  # type: ignore[method-assign]
    login = await oidc.complete(query, cookie)
    assert login.token_kind == "id_token" and login.principal.tenant_id == "acme"


async def test_a_public_client_signs_in_with_pkce_alone(provider: OidcProvider) -> None:
    provider.client_secret = None
    oidc = sign_in_for(provider, oidc_client_secret=None)
    url, cookie = await oidc.begin(REDIRECT)
    login = await oidc.complete(await authorize(url), cookie)
    assert login.subject == "alice"
    assert "client_secret" not in provider.token_requests[-1]
    assert provider.token_requests[-1]["client_id"] == provider.client_id


def test_create_app_offers_the_sign_in_only_when_a_client_is_configured(
    provider: OidcProvider, tmp_path: Path
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    base = jwt_settings(url, tmp_path, provider.issuer)
    assert create_app(base, check_schema_on_start=False).state.oidc_sign_in is None
    with_client = base.model_copy(
        update={"oidc_client_id": "treadle-console", "oidc_provider_name": "Acme SSO"}
    )
    sign_in = create_app(with_client, check_schema_on_start=False).state.oidc_sign_in
    assert isinstance(sign_in, OidcSignIn) and sign_in.provider_name == "Acme SSO"
    assert sign_in.redirect_url("https://treadle.example.com") == (
        "https://treadle.example.com/ui/login/oidc/callback"
    )


async def test_begin_with_the_provider_down_is_a_clear_error(provider: OidcProvider) -> None:
    provider.down = True
    with pytest.raises(OidcProviderError, match="discovery document cannot be read"):
        await sign_in_for(provider).begin(REDIRECT)


def test_oidc_settings_are_checked() -> None:
    base: dict[str, Any] = {
        "database_url": "sqlite+aiosqlite:///:memory:",
        "auth_mode": AuthMode.JWT,
        "jwt_audience": "treadle-api",
    }
    s = Settings(**base, oidc_issuer="https://idp.example/")
    assert s.jwt_issuer == "https://idp.example/"  # the issuer's tokens carry its URL
    with pytest.raises(ValueError, match="one source of keys"):
        Settings(**base, oidc_issuer="https://idp.example/", jwt_jwks_url="https://x/jwks")
    with pytest.raises(ValueError, match="TREADLE_OIDC_ISSUER"):
        Settings(**base, jwt_issuer="https://idp.example/")
    with pytest.raises(ValueError, match="needs TREADLE_AUTH_MODE=jwt"):
        Settings(
            database_url="sqlite+aiosqlite:///:memory:",
            dev_secret="x" * 32,
            oidc_issuer="https://idp.example/",
            oidc_client_id="console",
        )
    assert CALLBACK_PATH == "/ui/login/oidc/callback"
