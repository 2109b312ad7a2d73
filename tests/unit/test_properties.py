"""Property tests (hypothesis): backoff timing, page tokens, payload encoding.

Derandomized with a fixed example budget so CI runs are bounded and reproducible; raise
``TREADLE_HYPOTHESIS_EXAMPLES`` for a longer local hunt.
"""

from __future__ import annotations

import contextlib
import math
import os
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api.pagination import INT32_MAX, decode_token, encode_token, int_position
from app.core import json
from app.core.errors import BadRequest, InvalidInput, PayloadTooLarge
from app.sdk import RetryPolicy

EXAMPLES = int(os.environ.get("TREADLE_HYPOTHESIS_EXAMPLES", "300"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- backoff -----------------------------------------------------------------------------

delays = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 100),
    backoff=st.sampled_from(["fixed", "linear", "exponential"]),
    delay=delays,
    max_delay=delays,
    jitter=st.floats(min_value=0, max_value=1),
)


def _base(policy: RetryPolicy, attempt: int) -> float:
    """The documented backoff before jitter, clamped by max_delay."""
    growth = {"fixed": 1.0, "linear": float(attempt), "exponential": 2.0 ** min(attempt - 1, 62)}
    return min(policy.delay * growth[policy.backoff], policy.max_delay)


@PROPERTY
@given(policies, st.integers(1, 10_000), st.text(max_size=80))
def test_backoff_is_bounded_and_deterministic(policy: RetryPolicy, attempt: int, seed: str) -> None:
    wait = policy.delay_after(attempt, seed)
    base = _base(policy, attempt)
    assert math.isfinite(wait)
    assert 0 <= wait <= policy.max_delay
    assert base * (1 - policy.jitter) - 1e-9 * base <= wait <= base
    # A replay (same run, step, attempt) computes the same wait.
    assert policy.delay_after(attempt, seed) == wait


@PROPERTY
@given(policies, st.integers(1, 500), st.text(max_size=20))
def test_backoff_without_jitter_never_shrinks(policy: RetryPolicy, attempt: int, seed: str) -> None:
    steady = RetryPolicy(
        max_attempts=policy.max_attempts,
        backoff=policy.backoff,
        delay=policy.delay,
        max_delay=policy.max_delay,
    )
    assert steady.delay_after(attempt + 1, seed) >= steady.delay_after(attempt, seed)


@PROPERTY
@given(
    st.integers(-5, 200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=True, allow_infinity=True),
)
def test_out_of_range_policies_are_refused(attempts: int, delay: float, jitter: float) -> None:
    valid = 1 <= attempts <= 100 and delay >= 0 and 0 <= jitter <= 1
    if valid:
        RetryPolicy(max_attempts=attempts, delay=delay, jitter=jitter)
    else:
        with pytest.raises(ValueError):
            RetryPolicy(max_attempts=attempts, delay=delay, jitter=jitter)


# --- page tokens ---------------------------------------------------------------------------

tenants = st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1, max_size=40)
scopes = st.sampled_from(["runs", "dead-letters", "steps:r1", "events:r1", "steps:r2"])
filters = st.dictionaries(
    st.sampled_from(["workflow", "status", "created_after", "created_before"]),
    st.none() | st.text(max_size=30),
)
positions = st.uuids().map(str) | st.integers(0, 2**63 - 1)


@PROPERTY
@given(tenants, scopes, filters, positions)
def test_page_token_round_trips(tenant: str, scope: str, f: dict[str, Any], pos: Any) -> None:
    token = encode_token(tenant, scope, f, pos)
    assert set(token) <= set(string.ascii_letters + string.digits + "-_")  # URL-safe as is
    assert decode_token(token, tenant, scope, f) == pos


@PROPERTY
@given(tenants, tenants, scopes, scopes, filters, filters, positions)
def test_page_token_is_bound_to_tenant_scope_and_filters(
    tenant: str,
    other_tenant: str,
    scope: str,
    other_scope: str,
    f: dict[str, Any],
    other_f: dict[str, Any],
    pos: Any,
) -> None:
    token = encode_token(tenant, scope, f, pos)
    if (other_tenant, other_scope, other_f) == (tenant, scope, f):
        assert decode_token(token, other_tenant, other_scope, other_f) == pos
    else:
        with pytest.raises(BadRequest):
            decode_token(token, other_tenant, other_scope, other_f)


@PROPERTY
@given(tenants, scopes, filters, positions, st.data())
def test_tampered_page_tokens_are_refused(
    tenant: str, scope: str, f: dict[str, Any], pos: Any, data: st.DataObject
) -> None:
    token = encode_token(tenant, scope, f, pos)
    index = data.draw(st.integers(0, len(token) - 1), label="index")
    replacement = data.draw(
        st.sampled_from(string.ascii_letters + string.digits + "-_=+/ %\x00é"), label="char"
    )
    tampered = token[:index] + replacement + token[index + 1 :]
    try:
        decoded = decode_token(tampered, tenant, scope, f)
    except BadRequest:
        return
    # Only an edit that leaves the decoded bytes unchanged (unused low bits of the last
    # base64 character) may pass, and then it means exactly the same position.
    assert decoded == pos


@PROPERTY
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.hex()), tenants, scopes)
def test_garbage_page_tokens_are_bad_requests(token: str, tenant: str, scope: str) -> None:
    """Any string is either a valid token or a 400: never another exception (a 500)."""
    with contextlib.suppress(BadRequest):
        int_position(token, tenant, scope)


@PROPERTY
@given(tenants, st.integers() | st.booleans() | st.floats() | st.text(max_size=5) | st.none())
def test_integer_positions_are_range_checked(tenant: str, pos: Any) -> None:
    """A position the database column cannot hold is a 400, never a driver error (500)."""
    try:
        token = encode_token(tenant, "steps:r", {}, pos)
    except ValueError:  # NaN / infinity cannot even be encoded
        return
    ok = isinstance(pos, int) and not isinstance(pos, bool) and 0 <= pos <= INT32_MAX
    if ok:
        assert int_position(token, tenant, "steps:r", maximum=INT32_MAX) == pos
    else:
        with pytest.raises(BadRequest):
            int_position(token, tenant, "steps:r", maximum=INT32_MAX)


# --- payloads ------------------------------------------------------------------------------

# Any Unicode scalar value (NUL, controls, non-characters, astral planes, bidi marks) but
# no lone surrogates: those are not valid Unicode and are refused separately below.
odd_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 2^53 too: Python's json keeps them exact
    | st.floats(allow_nan=False, allow_infinity=False)
    | odd_text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(odd_text, inner, max_size=5),
    max_leaves=40,
)


@PROPERTY
@given(json_values)
def test_any_json_value_round_trips(value: Any) -> None:
    text = json.dumps_limited(value, 10_000_000, "input")
    assert text.isascii()  # safe in any TEXT column: NUL and astral characters escaped
    assert "\x00" not in text
    assert json.loads(text) == value
    assert json.dumps(json.loads(text)) == text  # stable: re-encoding changes nothing


def _nest(value: Any, depth: int, as_list: bool) -> Any:
    for _ in range(depth):
        value = [value] if as_list else {"k": value}
    return value


lone_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
invalid_values = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]).map(lambda f: {"x": [f]}),
    st.tuples(odd_text, lone_surrogates, odd_text).map("".join),
    st.tuples(odd_text, lone_surrogates).map(lambda t: {t[0] + t[1]: 1}),
    st.tuples(json_values, st.integers(json.MAX_DEPTH + 1, 3 * json.MAX_DEPTH), st.booleans()).map(
        lambda t: _nest(*t)
    ),
    st.sampled_from([{1, 2}, b"bytes", object(), {(1, 2): "tuple key"}, [1j]]),
)


@PROPERTY
@given(invalid_values)
def test_invalid_payloads_are_refused_with_invalid_input(value: Any) -> None:
    with pytest.raises(InvalidInput):
        json.dumps_limited(value, 10_000_000, "input")


@PROPERTY
@given(json_values, st.integers(1, 200))
def test_payload_ceiling_is_exact(value: Any, limit: int) -> None:
    size = len(json.dumps(value))
    if size <= limit:
        assert len(json.dumps_limited(value, limit, "input")) == size
    else:
        with pytest.raises(PayloadTooLarge):
            json.dumps_limited(value, limit, "input")
