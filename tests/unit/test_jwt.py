"""JWT verification against a JWKS (RFC 7519 / RFC 8725).

A real local JWKS server on 127.0.0.1 serves the provider's keys; every refusal is an
Unauthenticated (401).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from joserfc import jws, jwt
from joserfc.jwk import ECKey, KeySet, OKPKey, RSAKey

from app.auth.jwt import JwksSource, JwtVerifier
from app.auth.principal import Scope
from app.core.errors import IdentityProviderUnavailable, Unauthenticated
from app.core.settings import AuthMode, Settings

ISS = "https://idp.example.test/"
AUD = "treadle-api"


class Jwks:
    """A JWKS endpoint on 127.0.0.1 whose key set a test can rotate."""

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self.fetches = 0
        self.broken = False  # answer 503 instead of the key set
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.fetches += 1
                if owner.broken:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps(KeySet(owner.keys).as_dict(private=False)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def jwks() -> Iterator[Jwks]:
    server = Jwks()
    yield server
    server.close()


def settings_for(url: str, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "auth_mode": AuthMode.JWT,
        "jwt_issuer": ISS,
        "jwt_audience": AUD,
        "jwt_jwks_url": url,
        "jwks_refresh_min_seconds": 0,
        "jwt_leeway_seconds": 5,
        **extra,
    }
    return Settings(**values)


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {
        "iss": ISS,
        "aud": AUD,
        "sub": "user-1",
        "tenant": "acme",
        "scope": "runs:read runs:write",
        "groups": ["sales-manager"],
        "iat": now,
        "nbf": now,
        "exp": now + 300,
    }
    return {**base, **overrides}


SIGNING = jws.JWSRegistry(algorithms=["RS256", "ES256", "Ed25519"])


def sign(key: Any, alg: str, kid: str | None, body: dict[str, Any]) -> str:
    header: dict[str, Any] = {"alg": alg, "typ": "JWT"}
    if kid:
        header["kid"] = kid
    return jwt.encode(header, body, key, registry=SIGNING)


def hs256_with(secret: bytes, kid: str, body: dict[str, Any]) -> str:
    """An HS256 token signed by hand (joserfc itself refuses to build this key)."""
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    payload = b64(json.dumps(body).encode())
    mac = hmac.new(secret, f"{head}.{payload}".encode(), hashlib.sha256).digest()
    return f"{head}.{payload}.{b64(mac)}"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


async def test_valid_tokens_of_each_allowed_algorithm(jwks: Jwks) -> None:
    rsa = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
    ec = ECKey.generate_key("P-256", parameters={"kid": "ec-1"})
    ed = OKPKey.generate_key("Ed25519", parameters={"kid": "ed-1"})
    jwks.keys = [rsa, ec, ed]
    verifier = JwtVerifier(settings_for(jwks.url))
    for key, alg in ((rsa, "RS256"), (ec, "ES256"), (ed, "Ed25519")):
        principal = await verifier.verify(sign(key, alg, key.kid, claims()))
        assert (principal.tenant_id, principal.subject) == ("acme", "user-1")
        assert principal.scopes == frozenset({Scope.RUNS_READ, Scope.RUNS_WRITE})
        assert principal.groups == frozenset({"sales-manager"})
    assert jwks.fetches == 1  # cached


async def test_every_bad_token_is_refused(jwks: Jwks) -> None:
    rsa = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
    stranger = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
    jwks.keys = [rsa]
    verifier = JwtVerifier(settings_for(jwks.url))
    now = int(time.time())
    public_pem = rsa.as_pem(private=False)
    header_none = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    cases = {
        "alg none": f"{header_none}.{b64(json.dumps(claims()).encode())}.",
        "HS256 signed with the RSA public key": hs256_with(public_pem, "rsa-1", claims()),
        "signed by another key, same kid": sign(stranger, "RS256", "rsa-1", claims()),
        "unknown kid": sign(
            RSAKey.generate_key(2048, parameters={"kid": "nope"}), "RS256", "nope", claims()
        ),
        "expired": sign(rsa, "RS256", "rsa-1", claims(exp=now - 60, iat=now - 600)),
        "not yet valid": sign(rsa, "RS256", "rsa-1", claims(nbf=now + 600)),
        "wrong issuer": sign(rsa, "RS256", "rsa-1", claims(iss="https://evil.test/")),
        "wrong audience": sign(rsa, "RS256", "rsa-1", claims(aud="another-api")),
        "no tenant": sign(
            rsa, "RS256", "rsa-1", {k: v for k, v in claims().items() if k != "tenant"}
        ),
        "bad tenant": sign(rsa, "RS256", "rsa-1", claims(tenant="a b\u0000")),
        "tenant too long": sign(rsa, "RS256", "rsa-1", claims(tenant="t" * 129)),
        "no expiry": sign(rsa, "RS256", "rsa-1", {k: v for k, v in claims().items() if k != "exp"}),
        "garbage": "abc.def.ghi",
        "not a JWT": "hello",
        "non-ascii": "é.é.é",
    }
    for label, token in cases.items():
        with pytest.raises(Unauthenticated):
            await verifier.verify(token)
            pytest.fail(f"{label} was accepted")


async def test_key_rotation_refreshes_the_jwks_once(jwks: Jwks) -> None:
    old = RSAKey.generate_key(2048, parameters={"kid": "2026-11"})
    new = RSAKey.generate_key(2048, parameters={"kid": "2026-12"})
    jwks.keys = [old]
    verifier = JwtVerifier(settings_for(jwks.url))
    await verifier.verify(sign(old, "RS256", "2026-11", claims()))
    jwks.keys = [old, new]  # the provider publishes a new key, then signs with it
    principal = await verifier.verify(sign(new, "RS256", "2026-12", claims(sub="after")))
    assert principal.subject == "after"
    assert jwks.fetches == 2


async def test_refresh_is_rate_limited(jwks: Jwks) -> None:
    rsa = RSAKey.generate_key(2048, parameters={"kid": "k"})
    jwks.keys = [rsa]
    verifier = JwtVerifier(settings_for(jwks.url, jwks_refresh_min_seconds=3600))
    await verifier.verify(sign(rsa, "RS256", "k", claims()))
    attacker = RSAKey.generate_key(2048, parameters={"kid": "random"})
    for _ in range(5):  # unknown kids must not turn into a fetch per request
        with pytest.raises(Unauthenticated):
            await verifier.verify(sign(attacker, "RS256", "random", claims()))
    assert jwks.fetches == 1


async def test_jwks_file(tmp_path: Path) -> None:
    rsa = RSAKey.generate_key(2048, parameters={"kid": "file-key"})
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(KeySet([rsa]).as_dict(private=False)))
    settings = Settings(
        auth_mode=AuthMode.JWT, jwt_issuer=ISS, jwt_audience=AUD, jwt_jwks_file=path
    )
    principal = await JwtVerifier(settings).verify(sign(rsa, "RS256", "file-key", claims()))
    assert principal.tenant_id == "acme"


def test_jwt_mode_settings_are_validated() -> None:
    with pytest.raises(Exception, match="TREADLE_JWT_ISSUER"):
        Settings(auth_mode=AuthMode.JWT, jwt_audience=AUD, jwt_jwks_url="http://x/")
    with pytest.raises(Exception, match="JWKS"):
        Settings(auth_mode=AuthMode.JWT, jwt_issuer=ISS, jwt_audience=AUD)
    with pytest.raises(Exception, match="refused"):
        Settings(jwt_algorithms=["RS256", "HS256"])


async def test_unreachable_jwks_is_unavailable_not_unauthenticated(jwks: Jwks) -> None:
    rsa = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    jwks.keys = [rsa]
    jwks.broken = True
    verifier = JwtVerifier(settings_for(jwks.url))
    good = sign(rsa, "RS256", "k1", claims())
    with pytest.raises(IdentityProviderUnavailable):
        await verifier.verify(good)  # nothing loaded yet: cannot tell, so no 401
    jwks.broken = False
    deadline = time.monotonic() + 10
    while True:  # failed fetches are retried at most once a second
        try:
            await verifier.verify(good)
            break
        except IdentityProviderUnavailable:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    stranger = RSAKey.generate_key(2048, parameters={"kid": "k2"})
    unknown = sign(stranger, "RS256", "k2", claims())
    with pytest.raises(Unauthenticated):
        await verifier.verify(unknown)  # refreshed, still unknown
    jwks.broken = True
    assert (await verifier.verify(good)).tenant_id == "acme"  # the last good set is kept
    with pytest.raises(IdentityProviderUnavailable):
        await verifier.verify(unknown)  # its refresh failed: maybe a key we cannot see
    jwks.close()  # and now unreachable altogether
    assert (await verifier.verify(good)).tenant_id == "acme"
    with pytest.raises(IdentityProviderUnavailable):
        await verifier.verify(unknown)


async def test_concurrent_first_requests_share_one_fetch(jwks: Jwks) -> None:
    rsa = RSAKey.generate_key(2048, parameters={"kid": "k"})
    jwks.keys = [rsa]
    verifier = JwtVerifier(settings_for(jwks.url, jwks_refresh_min_seconds=60))
    good = sign(rsa, "RS256", "k", claims())
    principals = await asyncio.gather(*(verifier.verify(good) for _ in range(20)))
    assert {p.subject for p in principals} == {"user-1"}
    assert jwks.fetches == 1


async def test_aclose_ends_a_refresh_that_lost_its_cancellation(jwks: Jwks) -> None:
    """The background refresh stops even when a fetch swallows the first cancel.

    On Python 3.11 ``asyncio.wait_for`` can lose a cancellation that lands as the awaited
    call completes (CPython gh-86296, app/core/tasks.py); a refresh loop cancelled once
    then ran on after the API's shutdown. The fake fetch below loses the first one.
    """
    source = JwksSource(settings_for(jwks.url, jwks_refresh_interval_seconds=60))
    fetching = asyncio.Event()
    lost = 0

    async def refresh() -> bool:
        nonlocal lost
        fetching.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if lost:
                raise
            lost += 1  # swallowed, as wait_for can
        return True

    source.refresh = refresh  # type: ignore[method-assign]
    source.start()
    await asyncio.wait_for(fetching.wait(), 10)
    task = source._task
    assert task is not None
    # Waited on, not wait_for'd: a timeout's own cancel would end the refresh for us.
    closing = asyncio.create_task(source.aclose())
    done, _ = await asyncio.wait([closing], timeout=10)
    if not done:  # the defect: clean up before failing
        task.cancel()
        await asyncio.gather(closing, return_exceptions=True)
    assert closing in done, "aclose did not return while the refresh ran on"
    assert task.done() and lost == 1
