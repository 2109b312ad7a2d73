"""The credential watch of long-lived responses: its expiry timer, its interval, its causes.

The authenticator is the real one (dev tokens; jwt mode with a JWKS file for the leeway);
the clocks are the test's own where the timer is under test, so nothing waits. Over real
HTTP with each cause: tests/acceptance/test_stream_credentials.py. The clients' reading
of the ``end`` message's cause is here too.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from app.auth.authenticator import INVALID_TOKEN, Authenticator
from app.auth.credential_watch import CredentialWatch
from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from app.auth.token_cache import Verified
from app.client._sse import end_error
from app.core.errors import IdentityProviderUnavailable, Unauthenticated
from app.core.settings import AuthMode, Settings
from app.core.status import StreamEnd
from tests.conftest import DEV_SECRET

ISS = "https://idp.example.test/"
AUD = "treadle-api"


class Clocks:
    """A monotonic and a wall clock that only move when the test moves them."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = time.time()

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def dev_settings(tmp_path: Path) -> Settings:
    return Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}",
        auth_mode=AuthMode.DEV,
        dev_secret=DEV_SECRET,
    )


def dev_authenticator(tmp_path: Path) -> Authenticator:
    return Authenticator(dev_settings(tmp_path))


async def watch_of(
    auth: Authenticator, token: str, recheck: float, clocks: Clocks | None = None
) -> CredentialWatch:
    verified = await auth.authenticate_verified(token)
    if clocks is None:
        return CredentialWatch(auth, token, verified, recheck_seconds=recheck)
    return CredentialWatch(
        auth,
        token,
        verified,
        recheck_seconds=recheck,
        clock=lambda: clocks.mono,
        wall=lambda: clocks.wall,
    )


async def test_the_expiry_timer_ends_a_token_at_its_exp(tmp_path: Path) -> None:
    auth = dev_authenticator(tmp_path)
    token = DevTokens(DEV_SECRET).mint(
        tenant_id="acme", subject="a", scopes=ALL_SCOPES, ttl_seconds=100
    )
    clocks = Clocks()
    watch = await watch_of(auth, token, recheck=300, clocks=clocks)
    left = watch.seconds_left()
    assert 99 <= left <= 100  # the expiry, not the 300 s interval, is next
    clocks.advance(left - 0.001)
    assert await watch.lapsed() is None  # not due yet: nothing checked
    clocks.advance(0.001)
    lapse = await watch.lapsed()
    # Decided on the clock alone: the real verifier (real time) would still accept it.
    assert (await auth.authenticate(token)).subject == "a"
    assert lapse is not None and lapse.cause is StreamEnd.CREDENTIAL_EXPIRED
    assert isinstance(lapse.error, Unauthenticated) and lapse.error.detail == INVALID_TOKEN
    assert await watch.lapsed() is lapse  # lapsed for good, never checked again
    with pytest.raises(Unauthenticated):
        await watch.ensure_accepted()


async def test_the_interval_re_authenticates_through_the_authenticator(tmp_path: Path) -> None:
    auth = dev_authenticator(tmp_path)
    token = DevTokens(DEV_SECRET).mint(tenant_id="acme", subject="a", scopes=ALL_SCOPES)
    clocks = Clocks()
    watch = await watch_of(auth, token, recheck=5, clocks=clocks)
    assert watch.seconds_left() == 5
    clocks.advance(5)
    assert watch.seconds_left() == 0
    await watch.ensure_accepted()  # checked: still accepted
    assert watch.seconds_left() == 5  # the next check is one interval on


async def test_a_token_refused_before_its_expiry_is_revoked(tmp_path: Path) -> None:
    class Revoking(Authenticator):
        async def authenticate_verified(self, token: str) -> Verified:
            raise Unauthenticated(INVALID_TOKEN)

    auth = dev_authenticator(tmp_path)
    token = DevTokens(DEV_SECRET).mint(tenant_id="acme", subject="a", scopes=ALL_SCOPES)
    verified = await auth.authenticate_verified(token)
    revoking = Revoking(dev_settings(tmp_path))
    clocks = Clocks()
    watch = CredentialWatch(
        revoking,
        token,
        verified,
        recheck_seconds=1,
        clock=lambda: clocks.mono,
        wall=lambda: clocks.wall,
    )
    assert await watch.lapsed() is None  # not due: not checked
    clocks.advance(1)
    lapse = await watch.lapsed()
    assert lapse is not None and lapse.cause is StreamEnd.CREDENTIAL_REVOKED


async def test_a_revocation_through_this_process_is_checked_at_once(tmp_path: Path) -> None:
    class Revoking(Authenticator):
        async def authenticate_verified(self, token: str) -> Verified:
            raise Unauthenticated(INVALID_TOKEN)

    token = DevTokens(DEV_SECRET).mint(tenant_id="acme", subject="a", scopes=ALL_SCOPES)
    verified = await dev_authenticator(tmp_path).authenticate_verified(token)
    revoking = Revoking(dev_settings(tmp_path))
    clocks = Clocks()
    watch = CredentialWatch(
        revoking,
        token,
        verified,
        recheck_seconds=300,
        clock=lambda: clocks.mono,
        wall=lambda: clocks.wall,
    )
    assert await watch.lapsed() is None
    revoking.cache.forget_api_key(uuid.uuid4())  # what a revocation here does
    lapse = await watch.lapsed()  # no clock moved: the generation did
    assert lapse is not None and lapse.cause is StreamEnd.CREDENTIAL_REVOKED


async def test_an_unreachable_provider_defers_the_check(tmp_path: Path) -> None:
    class Unavailable(Authenticator):
        calls = 0

        async def authenticate_verified(self, token: str) -> Verified:
            self.calls += 1
            raise IdentityProviderUnavailable("the provider's keys cannot be loaded")

    settings = dev_settings(tmp_path)
    token = DevTokens(DEV_SECRET).mint(tenant_id="acme", subject="a", scopes=ALL_SCOPES)
    verified = await Authenticator(settings).authenticate_verified(token)
    auth = Unavailable(settings)
    clocks = Clocks()
    watch = CredentialWatch(
        auth,
        token,
        verified,
        recheck_seconds=2,
        clock=lambda: clocks.mono,
        wall=lambda: clocks.wall,
    )
    clocks.advance(2)
    assert await watch.lapsed() is None  # the token may be valid: the stream goes on
    assert auth.calls == 1 and watch.seconds_left() == 2  # and is checked again later


async def test_the_jwt_leeway_is_part_of_the_lifetime(tmp_path: Path) -> None:
    key = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(KeySet([key]).as_dict(private=False)))
    auth = Authenticator(
        Settings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}",
            auth_mode=AuthMode.JWT,
            jwt_issuer=ISS,
            jwt_audience=AUD,
            jwt_jwks_file=jwks,
            jwt_leeway_seconds=30,
        )
    )
    now = int(time.time())
    body = {"iss": ISS, "aud": AUD, "sub": "s", "tenant": "acme", "iat": now - 60}
    # Expired 10 s ago, within the 30 s leeway: a new request is still let in, so is the
    # stream, until exp + 30 s.
    token = jwt.encode({"alg": "RS256", "kid": "k1"}, {**body, "exp": now - 10}, key)
    assert auth.leeway_seconds == 30
    watch = await watch_of(auth, token, recheck=300)
    assert 18 <= watch.seconds_left() <= 20
    await auth.aclose()


@pytest.mark.parametrize(
    ("data", "code", "status"),
    [
        ('{"cause": "credential_expired", "run_id": "r"}', "credential_expired", 401),
        ('{"cause": "credential_revoked"}', "credential_revoked", 401),
        ('{"cause": "tenant_suspended"}', "tenant_suspended", 403),
        ('{"cause": "something_new"}', "something_new", None),
    ],
)
def test_the_clients_raise_on_an_end_the_run_did_not_cause(
    data: str, code: str, status: int | None
) -> None:
    error = end_error(data)
    assert error is not None
    assert error.code == code and error.status == status
    assert error.problem == json.loads(data)


@pytest.mark.parametrize(
    "data",
    ['{"cause": "run_ended"}', '{"cause": "run_gone"}', '{"status": "completed"}', "not json"],
)
def test_a_run_end_or_an_older_server_s_end_just_ends(data: str) -> None:
    assert end_error(data) is None
