"""Payload encoding, settings validation, submission fingerprints, page tokens, tokens."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from app.api.pagination import decode_token, encode_token
from app.auth.dev import DevTokens
from app.auth.principal import Scope
from app.core import json
from app.core.errors import BadRequest, PayloadTooLarge, Unauthenticated
from app.core.ids import is_tenant_id
from app.core.settings import Settings, format_settings_error
from app.engine.submit import SubmitRequest
from app.sdk import WorkflowContext, workflow

SECRET = "unit-secret-" + "z" * 40


def test_payload_round_trips_exactly() -> None:
    value = {
        "nul": "a\u0000b",
        "clef": "𝄞😀",
        "lone": "\ud800",
        "big": 2**64 + 1,
        "neg": -(2**70),
        "float": 0.1,
        "rtl": "\u202eabc\u200b",
        "nested": [[[{"k": None}]]],
    }
    text = json.dumps(value)
    assert text.isascii()
    assert "\x00" not in text  # storable in PostgreSQL TEXT
    assert json.loads(text) == value
    assert "18446744073709551617" in text


def test_payload_limit() -> None:
    limit = 1024
    at_limit = "x" * (limit - 2)  # two quote characters
    assert len(json.dumps_limited(at_limit, limit, "input")) == limit
    with pytest.raises(PayloadTooLarge) as err:
        json.dumps_limited(at_limit + "x", limit, "input")
    assert err.value.data == {"limit_bytes": limit, "size_bytes": limit + 1}


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError):
        json.dumps(float("nan"))


def test_heartbeat_must_be_under_half_the_ttl() -> None:
    with pytest.raises(Exception) as err:
        Settings(lease_ttl_seconds=10, heartbeat_interval_seconds=5)
    assert "TREADLE_HEARTBEAT_INTERVAL_SECONDS" in format_settings_error(err.value)


def test_invalid_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREADLE_PORT", "eighty")
    with pytest.raises(Exception) as err:
        Settings()
    message = format_settings_error(err.value)
    assert message.startswith("TREADLE_PORT:")
    assert "eighty" in message


def test_fingerprint_distinguishes_requests() -> None:
    base = SubmitRequest(workflow="w", input={"a": 1}, idempotency_key="k")
    same = SubmitRequest(workflow="w", input={"a": 1}, idempotency_key="k")
    assert base.fingerprint() == same.fingerprint()
    for other in (
        SubmitRequest(workflow="w", input={"a": 2}, idempotency_key="k"),
        SubmitRequest(workflow="w2", input={"a": 1}, idempotency_key="k"),
        SubmitRequest(workflow="w", input={"a": 1}, version="2", idempotency_key="k"),
        SubmitRequest(workflow="w", input={"a": 1}, delay=5, idempotency_key="k"),
    ):
        assert other.fingerprint() != base.fingerprint()


def test_page_tokens_are_bound_to_tenant_and_filters() -> None:
    token = encode_token("t1", "runs", {"status": "queued"}, "pos")
    assert decode_token(token, "t1", "runs", {"status": "queued"}) == "pos"
    for tenant, filters in (("t2", {"status": "queued"}), ("t1", {"status": "failed"})):
        with pytest.raises(BadRequest):
            decode_token(token, tenant, "runs", filters)
    for garbage in ("", "!!!", "e30", "bm90IGpzb24"):
        with pytest.raises(BadRequest):
            decode_token(garbage, "t1", "runs", {})


def test_dev_tokens() -> None:
    tokens = DevTokens(SECRET)
    tok = tokens.mint(tenant_id="acme", subject="ann", scopes=[Scope.RUNS_READ])
    principal = tokens.verify(tok)
    assert (principal.tenant_id, principal.subject) == ("acme", "ann")
    assert principal.has(Scope.RUNS_READ)
    assert not principal.has(Scope.RUNS_WRITE)
    forged = DevTokens("other-secret-" + "q" * 40).mint(tenant_id="acme", subject="x", scopes=[])
    expired = tokens.mint(tenant_id="acme", subject="ann", scopes=[], ttl_seconds=-60)
    for bad in (forged, expired, "abc.def.ghi", tok[:-3] + "AAA", ""):
        with pytest.raises(Unauthenticated):
            tokens.verify(bad)
    with pytest.raises(ValueError):
        tokens.mint(tenant_id="bad tenant\x00", subject="x", scopes=[])


class In(BaseModel):
    x: int


def test_workflow_decorator_validates_definition() -> None:
    with pytest.raises(ValueError):
        workflow("bad name!")
    with pytest.raises(TypeError, match="async"):

        @workflow("sync-body")  # type: ignore[arg-type]
        def body(ctx: WorkflowContext, i: In) -> int:
            return 1

    with pytest.raises(TypeError, match="BaseModel"):

        @workflow("untyped")  # type: ignore[type-var]
        async def untyped(ctx: WorkflowContext, i: int) -> int:
            return i

    @workflow("fine", version=3)
    async def fine(ctx: WorkflowContext, i: In) -> int:
        return i.x

    assert (fine.name, fine.version, fine.key) == ("fine", "3", "fine@3")
    assert fine.input_schema["properties"]["x"]["type"] == "integer"
    assert fine.output_schema == {"type": "integer"}


def test_default_database_follows_data_dir(tmp_path: object) -> None:
    settings = Settings(data_dir=f"{tmp_path}/state")
    assert settings.database_url == f"sqlite+aiosqlite:///{tmp_path}/state/treadle.db"
    assert Settings(database_url="postgresql+asyncpg://x/y").database_url.startswith("postgres")


def test_invalid_secret_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREADLE_DEV_SECRET", "short-secret")
    with pytest.raises(Exception) as err:
        Settings()
    message = format_settings_error(err.value)
    assert "TREADLE_DEV_SECRET" in message
    assert "short-secret" not in message


def test_payload_checks_refuse_what_no_model_accepts() -> None:
    from app.core.errors import InvalidInput

    for bad in (float("nan"), {"x": float("inf")}, "a\ud800", {"\udc00": 1}):
        with pytest.raises(InvalidInput):
            json.dumps_limited(bad, 10_000, "input")
    with pytest.raises(InvalidInput):
        json.check_depth([[[[1]]]], "input", max_depth=3)
    json.check_depth([[[1]]], "input", max_depth=3)
    assert json.dumps_limited({"ok": "𝄞\u0000"}, 100, "input") == '{"ok":"\\ud834\\udd1e\\u0000"}'


def test_integer_page_positions() -> None:
    from app.api.pagination import int_position

    assert int_position(None, "t1", "steps:x") is None
    assert int_position(encode_token("t1", "steps:x", {}, 7), "t1", "steps:x") == 7
    for bad in (
        encode_token("t1", "steps:x", {}, "7"),
        encode_token("t1", "steps:x", {}, True),
        encode_token("t2", "steps:x", {}, 7),
        encode_token("t1", "events:x", {}, 7),
    ):
        with pytest.raises(BadRequest):
            int_position(bad, "t1", "steps:x")


def test_tenant_id_rule() -> None:
    """One rule for every tenant id: token claims, API keys, /admin/tenants/{tenant}."""
    for good in ("acme", "a", "A-b_c.9", "t" * 128):
        assert is_tenant_id(good), good
    for bad in ("", "t" * 129, "acme\n", "a b", "a\x00b", "é", "a/b", None, 7, ["acme"]):
        assert not is_tenant_id(bad), bad
    with pytest.raises(ValueError, match="tenant must be"):
        DevTokens("x" * 32).mint(tenant_id="t" * 129, subject="s", scopes=[Scope.RUNS_READ])
