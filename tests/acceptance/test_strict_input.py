"""Credentials and JSON bodies held to the documented promises, over real HTTP.

- Every bad credential (malformed, unknown, forged or revoked API key; forged, expired or
  garbage token) is one indistinguishable ``401``: same body, same challenge.
- A JSON body must be UTF-8 (no UTF-16/32, no byte order mark, no ``charset`` but
  ``utf-8``) and must not repeat a key in any object at any depth, on every
  JSON-accepting endpoint: ``400 malformed_json``, nothing stored.
- With the identity provider's JWKS (from a URL: a local HTTP server this test starts
  and stops) unreachable, valid tokens get ``503`` with ``Retry-After``, not ``401``;
  the last good JWKS stays in use; an unknown ``kid`` is still ``401`` after a refresh.
"""

from __future__ import annotations

import codecs
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from app.api.app import openapi_document
from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from tests.acceptance.conftest import Stack, free_port, token
from tests.acceptance.test_http_input import assert_problem, list_run_ids, register_workflows
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

SUBMIT = {"workflow": "acc-echo", "input": {"value": "é"}}


def _bodies_of(response: httpx.Response) -> tuple[int, dict[str, Any], str]:
    body = dict(response.json())
    body.pop("instance", None)
    return response.status_code, body, response.headers.get("www-authenticate", "")


def test_every_bad_credential_gets_one_indistinguishable_401(stack: Stack) -> None:
    admin = token(tenant="keys", subject="ops", scopes=ALL_SCOPES)
    with stack.client(admin) as c:
        live = c.post("/admin/api-keys", json={"name": "live", "scopes": ["runs:read"]})
        gone = c.post("/admin/api-keys", json={"name": "gone", "scopes": ["runs:read"]})
        assert live.status_code == gone.status_code == 201, live.text
        revoked_key = gone.json()["api_key"]
        assert c.delete(f"/admin/api-keys/{gone.json()['key_id']}").status_code == 200
    live_key = live.json()["api_key"]
    prefix = live_key.split("_")[1]
    bad = {
        "revoked API key": revoked_key,
        "unknown API key (well-formed)": "trd_0123456789ab_" + "A" * 43,
        "forged API key (known prefix, wrong secret)": f"trd_{prefix}_" + "B" * 43,
        "malformed API key": "trd_short",
        "API key with a stray byte": live_key + "x",
        "forged dev token": DevTokens("another-secret-" + "y" * 40).mint(
            tenant_id="keys", subject="mallory", scopes=ALL_SCOPES
        ),
        "expired dev token": DevTokens(DEV_SECRET).mint(
            tenant_id="keys", subject="ops", scopes=ALL_SCOPES, ttl_seconds=-10
        ),
        "garbage": "abc.def.ghi",
    }
    seen: dict[str, tuple[int, dict[str, Any], str]] = {}
    for what, credential in bad.items():
        with stack.client(credential) as c:
            resp = c.get("/runs")
        assert_problem(resp, 401, "unauthenticated", what)
        seen[what] = _bodies_of(resp)
    first = next(iter(seen.values()))
    for what, outcome in seen.items():
        assert outcome == first, f"{what} is distinguishable: {outcome} vs {first}"
    for word in ("revoked", "unknown", "malformed", "expired", "signature"):
        assert word not in json.dumps(first).lower(), first
    with stack.client(live_key) as c:
        assert c.get("/runs").status_code == 200  # the live key still works


def _encoded(text: str, codec: str, bom: bytes = b"") -> bytes:
    return bom + text.encode(codec)


def test_non_utf8_bodies_bom_and_charsets_are_refused(stack: Stack) -> None:
    register_workflows(stack)
    text = json.dumps(SUBMIT, ensure_ascii=False)
    cases: dict[str, tuple[bytes, str]] = {
        "UTF-16-LE": (_encoded(text, "utf-16-le"), "application/json"),
        "UTF-16-BE": (_encoded(text, "utf-16-be"), "application/json"),
        "UTF-16 with BOM": (_encoded(text, "utf-16"), "application/json"),
        "UTF-32-LE": (_encoded(text, "utf-32-le"), "application/json"),
        "UTF-32-BE": (_encoded(text, "utf-32-be"), "application/json"),
        "UTF-32 with BOM": (_encoded(text, "utf-32"), "application/json"),
        "UTF-8 with BOM": (_encoded(text, "utf-8", codecs.BOM_UTF8), "application/json"),
        "Latin-1": (text.encode("latin-1"), "application/json"),
        "charset=utf-16": (_encoded(text, "utf-16"), "application/json; charset=utf-16"),
        "charset=latin-1 (ASCII body)": (
            json.dumps(SUBMIT).encode(),
            "application/json; charset=iso-8859-1",
        ),
        "charset=utf-32 on +json": (
            _encoded(text, "utf-32"),
            "application/merge+json; charset=utf-32",
        ),
    }
    tenant = "encodings"
    with stack.client(token(tenant=tenant)) as c:
        for what, (body, content_type) in cases.items():
            resp = c.post("/runs", content=body, headers={"Content-Type": content_type})
            problem = assert_problem(resp, 400, "malformed_json", what)
            assert "utf-8" in problem["detail"].lower(), problem
        assert list_run_ids(stack, tenant) == [], "a refused body stored a run"
        # UTF-8, with or without charset=utf-8 (any case), is accepted.
        for content_type in ("application/json", "application/json; charset=UTF-8"):
            resp = c.post(
                "/runs", content=text.encode("utf-8"), headers={"Content-Type": content_type}
            )
            assert resp.status_code == 201, resp.text
    assert len(list_run_ids(stack, tenant)) == 2


def _json_operations() -> list[tuple[str, str]]:
    """Every (method, path template) whose request body is JSON, from the app's spec."""
    ops: list[tuple[str, str]] = []
    for path, item in openapi_document()["paths"].items():
        for method, op in item.items():
            content = op.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                ops.append((method.upper(), path))
    return ops


def test_duplicate_keys_are_refused_on_every_json_endpoint(stack: Stack) -> None:
    register_workflows(stack)
    tenant = "dupes"
    admin = token(tenant=tenant, subject="ops", scopes=ALL_SCOPES)
    operations = _json_operations()
    assert len(operations) >= 10, operations
    duplicated = [
        b'{"workflow":"acc-echo","workflow":"other","input":{}}',
        b'{"workflow":"acc-echo","input":{"a":{"b":[{"c":1,"c":2}]}}}',
        b'{"workflow":"acc-echo","input":{"x":1,"y":{"z":[[{"":1,"":1}]]}}}',
    ]
    with stack.client(admin) as c:
        for method, template in operations:
            url = template
            for name in ("run_id", "step_id", "schedule_id", "key_id", "dead_letter_id"):
                url = url.replace("{" + name + "}", str(uuid.uuid4()))
            url = url.replace("{name}", "sig").replace("{tenant}", tenant)
            for body in duplicated:
                resp = c.request(
                    method, url, content=body, headers={"Content-Type": "application/json"}
                )
                problem = assert_problem(resp, 400, "malformed_json", f"{method} {template}")
                assert "key" in problem["detail"], problem
        assert list_run_ids(stack, tenant) == [], "a refused body stored a run"
        assert c.get("/schedules").json()["items"] == []
        # The same key in different objects is fine.
        ok = c.post(
            "/runs",
            content=b'{"workflow":"acc-echo","input":{"a":{"a":1},"b":{"a":2}}}',
            headers={"Content-Type": "application/json"},
        )
        assert ok.status_code == 201, ok.text


# --- JWKS from a URL, with the identity provider going away and coming back --------------

ISS = "https://idp.example.test/"
AUD = "treadle-api"
KEY = RSAKey.generate_key(2048, parameters={"kid": "idp-1"})
STRANGER = RSAKey.generate_key(2048, parameters={"kid": "idp-unknown"})


def idp_token(key: RSAKey) -> str:
    now = int(time.time())
    claims = {
        "iss": ISS,
        "aud": AUD,
        "sub": "svc",
        "tenant": "idp",
        "scope": "runs:read",
        "iat": now,
        "exp": now + 600,
    }
    return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)


class JwksServer:
    """The provider's JWKS endpoint on 127.0.0.1:``port``, started and stopped at will."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        body = json.dumps(KeySet([KEY]).as_dict(private=False)).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            assert self.thread is not None
            self.thread.join(timeout=10)
            self.server = None


@pytest.fixture
def idp(
    database_url: str, tmp_path: Path, stack_env: dict[str, str]
) -> Iterator[tuple[Stack, JwksServer]]:
    jwks = JwksServer(free_port())
    env = {
        **stack_env,
        "TREADLE_AUTH_MODE": "jwt",
        "TREADLE_JWT_ISSUER": ISS,
        "TREADLE_JWT_AUDIENCE": AUD,
        "TREADLE_JWT_JWKS_URL": f"http://127.0.0.1:{jwks.port}/jwks.json",
        "TREADLE_JWKS_REFRESH_MIN_SECONDS": "0",
    }
    s = Stack(database_url=database_url, tmp=tmp_path, env=env)
    s.start_api()  # /readyz needs no token: the provider is not asked yet
    try:
        yield s, jwks
    finally:
        s.stop()
        jwks.stop()


def _get_runs(s: Stack, tok: str) -> httpx.Response:
    with s.client(tok) as c:
        return c.get("/runs")


def _assert_unavailable(resp: httpx.Response, what: str) -> None:
    assert resp.status_code == 503, f"{what}: {resp.status_code} {resp.text}"
    assert resp.headers.get("content-type", "").startswith("application/problem+json"), what
    assert resp.json()["code"] == "identity_provider_unavailable", resp.text
    assert int(resp.headers["retry-after"]) >= 1, resp.headers
    assert "www-authenticate" not in resp.headers, what


def test_unreachable_jwks_is_503_and_the_last_good_keys_stay(idp: tuple[Stack, JwksServer]) -> None:
    s, jwks = idp
    valid, unknown_kid = idp_token(KEY), idp_token(STRANGER)
    # 1. The provider is down from the start: a valid token cannot be checked.
    _assert_unavailable(_get_runs(s, valid), "valid token, JWKS never loaded")
    _assert_unavailable(_get_runs(s, unknown_kid), "unknown kid, JWKS never loaded")
    # 2. It comes up: the same token works (failed fetches are retried within a second).
    jwks.start()
    wait_for_sync(lambda: _get_runs(s, valid).status_code == 200, timeout=30, what="JWKS loaded")
    # An unknown kid is refreshed for and, still unknown, is a 401.
    resp = _get_runs(s, unknown_kid)
    assert_problem(resp, 401, "unauthenticated", "unknown kid after a refresh")
    assert resp.headers["www-authenticate"].startswith("Bearer")
    # 3. It goes down again: the cached key set keeps valid tokens working...
    jwks.stop()
    for _ in range(3):
        assert _get_runs(s, valid).status_code == 200
    # ...while a kid that only a refresh could find cannot be checked: 503, not 401.
    _assert_unavailable(_get_runs(s, unknown_kid), "unknown kid, JWKS unreachable")
    assert _get_runs(s, valid).status_code == 200
    # 4. Back up: the unknown kid is a 401 again after its refresh.
    jwks.start()
    wait_for_sync(
        lambda: _get_runs(s, unknown_kid).status_code == 401,
        timeout=30,
        what="refresh succeeded",
    )
    assert _get_runs(s, valid).status_code == 200
