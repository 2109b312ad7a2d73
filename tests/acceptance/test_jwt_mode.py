"""The API in ``TREADLE_AUTH_MODE=jwt``.

A real RS256 token from a JWKS works end to end with a worker; dev tokens and tokens of
other issuers are refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from tests.acceptance.conftest import Stack, token
from tests.helpers import wait_for_sync

ISS = "https://idp.example.test/"
AUD = "treadle-api"
KEY = RSAKey.generate_key(2048, parameters={"kid": "acceptance-1"})


def idp_token(**overrides: Any) -> str:
    now = int(time.time())
    body = {
        "iss": ISS,
        "aud": AUD,
        "sub": "svc-orders",
        "tenant": "acme",
        "scope": "runs:read runs:write",
        "iat": now,
        "exp": now + 600,
        **overrides,
    }
    return jwt.encode({"alg": "RS256", "kid": "acceptance-1"}, body, KEY)


@pytest.fixture
def jwt_stack(database_url: str, tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(KeySet([KEY]).as_dict(private=False)))
    env = {
        **stack_env,
        "TREADLE_AUTH_MODE": "jwt",
        "TREADLE_JWT_ISSUER": ISS,
        "TREADLE_JWT_AUDIENCE": AUD,
        "TREADLE_JWT_JWKS_FILE": str(jwks),
    }
    s = Stack(database_url=database_url, tmp=tmp_path, env=env)
    s.start_api()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_rs256_token_end_to_end(jwt_stack: Stack) -> None:
    good = idp_token()
    with jwt_stack.client(good) as c:
        assert c.get("/runs").status_code == 200
    # The worker registers its definitions straight in the database: no token involved.
    jwt_stack.workers.append(
        jwt_stack._spawn(["worker", "--handlers", "tests.acceptance.handlers"], "worker")
    )
    with jwt_stack.client(good) as c:
        wait_for_sync(
            lambda: c.get("/workflows").json()["items"] != [], what="definitions registered"
        )
        created = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": "jwt"}})
        assert created.status_code == 201, created.text
        run = created.json()
        assert run["created_by"] == "svc-orders"
        result = wait_for_sync(
            lambda: (
                (b := c.get(f"/runs/{run['run_id']}/result", params={"wait": 5}).json())["done"]
                and b
            ),
            timeout=60,
            what="run finished",
        )
    assert result["output"] == "jwt"
    refused = {
        "dev token": token(),
        "other issuer": idp_token(iss="https://evil.test/"),
        "expired": idp_token(exp=int(time.time()) - 120, iat=int(time.time()) - 900),
    }
    for label, tok in refused.items():
        with jwt_stack.client(tok) as c:
            resp = c.get("/runs")
        assert resp.status_code == 401, label
        assert resp.headers["www-authenticate"].startswith("Bearer"), label
