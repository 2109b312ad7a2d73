"""The verified-token cache (app/auth/token_cache.py) alone and inside the authenticator.

JWTs are real RS256 tokens checked against a JWKS file; the clock that passes a token's
``exp`` is the real one (waited on with a deadline), since the verifier reads it too.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from app.auth.authenticator import Authenticator
from app.auth.principal import Principal, Scope
from app.auth.token_cache import TokenCache, Verified, digest
from app.core.errors import Unauthenticated
from app.core.settings import AuthMode, Settings

ISS = "https://idp.example.test/"
AUD = "treadle-api"


def principal(key_id: uuid.UUID | None = None, tenant: str = "acme") -> Principal:
    return Principal(tenant, "alice", frozenset({Scope.RUNS_READ}), api_key_id=key_id)


class Clock:
    """A wall clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_keyed_by_the_tokens_sha256_never_the_token() -> None:
    cache = TokenCache(size=10, ttl_seconds=60)
    token = "trd_0123456789ab_" + "s" * 43
    cache.put(token, Verified(principal()), generation=cache.generation)
    assert cache.digests() == {hashlib.sha256(token.encode()).digest()}
    assert digest(token) == hashlib.sha256(token.encode()).digest()
    # Nothing the cache holds (keys or values) contains the token or its secret part.
    held = repr(list(cache._entries.items()))
    assert token not in held and "s" * 43 not in held
    assert cache.get(token) == principal()


def test_bounded_least_recently_used_goes_first() -> None:
    cache = TokenCache(size=3, ttl_seconds=60)
    tokens = [f"token-{i}" for i in range(6)]
    for t in tokens[:3]:
        cache.put(t, Verified(principal()), generation=cache.generation)
    assert cache.get(tokens[0]) is not None  # touched: now the most recently used
    for t in tokens[3:]:
        cache.put(t, Verified(principal()), generation=cache.generation)
        assert len(cache) <= 3
    assert len(cache) == 3
    assert cache.digests() == {digest(t) for t in tokens[3:]}
    # And with 1,000 distinct tokens it still holds 3.
    for i in range(1000):
        cache.put(f"many-{i}", Verified(principal()), generation=cache.generation)
    assert len(cache) == 3


def test_never_past_exp_on_the_wall_clock() -> None:
    clock = Clock()
    cache = TokenCache(size=10, ttl_seconds=300, clock=clock)
    cache.put("jwt", Verified(principal(), expires_at=clock.now + 10), generation=0)
    assert cache.get("jwt") is not None
    clock.now += 10  # at exp: no longer trusted (the verifier decides from here on)
    assert cache.get("jwt") is None
    assert len(cache) == 0
    # A token already at or past its exp (inside a verifier's leeway) is not stored.
    cache.put("late", Verified(principal(), expires_at=clock.now), generation=0)
    assert cache.get("late") is None and len(cache) == 0


def test_ttl_bounds_entries_without_exp() -> None:
    cache = TokenCache(size=10, ttl_seconds=0.2)
    cache.put("key", Verified(principal()), generation=0)
    deadline = time.monotonic() + 10
    while cache.get("key") is not None:
        assert time.monotonic() < deadline, "the entry outlived its TTL"
        time.sleep(0.02)


def test_revocation_drops_the_keys_entries_and_a_verification_under_way() -> None:
    cache = TokenCache(size=10, ttl_seconds=60)
    dead, live = uuid.uuid4(), uuid.uuid4()
    cache.put("dead", Verified(principal(dead)), generation=0)
    cache.put("live", Verified(principal(live)), generation=0)
    started = cache.generation  # a verification of "dead" begins here...
    cache.forget_api_key(dead)  # ...the revocation commits meanwhile...
    cache.put("dead", Verified(principal(dead)), generation=started)  # ...and is not stored
    assert cache.get("dead") is None
    assert cache.get("live") is not None


def test_off_when_size_or_ttl_is_zero() -> None:
    for cache in (TokenCache(size=0, ttl_seconds=60), TokenCache(size=10, ttl_seconds=0)):
        cache.put("t", Verified(principal()), generation=cache.generation)
        assert cache.get("t") is None and len(cache) == 0


# --- inside the authenticator, jwt mode ------------------------------------------------


@pytest.fixture
def rsa() -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": "k1"})


def jwt_authenticator(tmp_path: Path, key: RSAKey, **extra: Any) -> Authenticator:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(KeySet([key]).as_dict(private=False)))
    settings = Settings(
        auth_mode=AuthMode.JWT,
        jwt_issuer=ISS,
        jwt_audience=AUD,
        jwt_jwks_file=path,
        jwt_leeway_seconds=0,
        **extra,
    )
    return Authenticator(settings)


def mint(key: RSAKey, **overrides: Any) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISS,
        "aud": AUD,
        "sub": "u",
        "tenant": "acme",
        "scope": "runs:read",
    }
    claims |= {"iat": now, "exp": now + 300, **overrides}
    return jwt.encode({"alg": "RS256", "kid": "k1"}, claims, key)


async def test_expired_jwt_is_refused_after_exp_even_if_cached(tmp_path: Path, rsa: RSAKey) -> None:
    auth = jwt_authenticator(tmp_path, rsa, auth_cache_ttl_seconds=300)
    exp = int(time.time()) + 2
    token = mint(rsa, exp=exp)
    assert (await auth.authenticate(token)).tenant_id == "acme"
    assert digest(token) in auth.cache.digests()  # cached, for up to 300 s by the TTL
    assert (await auth.authenticate(token)).tenant_id == "acme"  # a hit
    deadline = time.monotonic() + 30
    while time.time() <= exp:  # the real clock must pass exp: the verifier reads it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(Unauthenticated):
        await auth.authenticate(token)
    assert digest(token) not in auth.cache.digests()


async def test_forged_and_refused_tokens_are_never_cached(tmp_path: Path, rsa: RSAKey) -> None:
    auth = jwt_authenticator(tmp_path, rsa)
    good = mint(rsa)
    await auth.authenticate(good)
    assert auth.cache.digests() == {digest(good)}
    head, payload, signature = good.split(".")
    # Same header and payload, another signature; a key the JWKS does not hold; expired.
    attacker = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    flipped = signature[:-2] + ("AA" if not signature.endswith("AA") else "BB")
    forged = [
        f"{head}.{payload}.{flipped}",
        mint(attacker),
        mint(rsa, exp=int(time.time()) - 5),
    ]
    for bad in forged:
        for _ in range(2):  # refused the second time too: the refusal was not remembered
            with pytest.raises(Unauthenticated):
                await auth.authenticate(bad)
    assert auth.cache.digests() == {digest(good)}


async def test_cache_off_still_verifies(tmp_path: Path, rsa: RSAKey) -> None:
    auth = jwt_authenticator(tmp_path, rsa, auth_cache_size=0)
    token = mint(rsa)
    assert (await auth.authenticate(token)).subject == "u"
    assert len(auth.cache) == 0


def test_a_jwt_verified_against_an_older_key_set_is_a_miss() -> None:
    cache = TokenCache(size=10, ttl_seconds=60)
    entry = Verified(principal(), expires_at=time.time() + 60, keys_version=1)
    cache.put("jwt", entry, generation=cache.generation)
    assert cache.get("jwt", keys_version=1) is not None
    assert cache.get("jwt", keys_version=2) is None  # the provider's set changed
    assert len(cache) == 0
