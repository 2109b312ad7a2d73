"""The strict JSON body rules (:func:`app.api.request_guards.check_json_body`), by property.

Any JSON value is accepted as UTF-8 and refused in any other encoding or behind a BOM;
a duplicate key anywhere in it is refused. The HTTP behaviour (400, nothing stored, every
endpoint) is in tests/acceptance/test_strict_input.py.
"""

from __future__ import annotations

import codecs
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.request_guards import check_json_body

keys = st.text(max_size=8)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(value=values)
def test_utf8_json_is_accepted(value: Any) -> None:
    assert check_json_body(json.dumps(value, ensure_ascii=False).encode("utf-8")) is None
    assert check_json_body(json.dumps(value).encode("ascii")) is None


@settings(max_examples=200, deadline=None)
@given(
    value=values,
    codec=st.sampled_from(["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32-be", "utf-32"]),
)
def test_other_encodings_are_refused(value: Any, codec: str) -> None:
    reason = check_json_body(json.dumps(value, ensure_ascii=False).encode(codec))
    assert reason is not None and ("UTF-8" in reason or "byte order mark" in reason)


@settings(max_examples=100, deadline=None)
@given(value=values)
def test_a_bom_is_refused(value: Any) -> None:
    body = codecs.BOM_UTF8 + json.dumps(value).encode()
    assert "byte order mark" in (check_json_body(body) or "")


def _with_duplicate(value: Any, path: list[int], key: str) -> str:
    """``value`` as JSON text with an object holding ``key`` twice, at a depth from ``path``."""
    if path and isinstance(value, list) and value:
        i = path[0] % len(value)
        items = [json.dumps(v) for v in value]
        items[i] = _with_duplicate(value[i], path[1:], key)
        return "[" + ",".join(items) + "]"
    if path and isinstance(value, dict) and value:
        name = sorted(value)[path[0] % len(value)]
        parts = [
            f"{json.dumps(k)}:{_with_duplicate(v, path[1:], key) if k == name else json.dumps(v)}"
            for k, v in value.items()
        ]
        return "{" + ",".join(parts) + "}"
    k = json.dumps(key)
    return "{" + f"{k}:1,{k}:2" + "}"


@settings(max_examples=200, deadline=None)
@given(value=values, path=st.lists(st.integers(min_value=0), max_size=6), key=keys)
def test_a_duplicate_key_at_any_depth_is_refused(value: Any, path: list[int], key: str) -> None:
    body = _with_duplicate(value, path, key).encode("utf-8")
    reason = check_json_body(body)
    assert reason is not None and "repeats the key" in reason, body


def test_deep_nesting_is_left_to_the_route() -> None:
    # The route answers it with 422 invalid_input, as before.
    assert check_json_body(b"[" * 5000 + b"]" * 5000) is None
