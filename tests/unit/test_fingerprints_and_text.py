"""Canonical request fingerprints and safe plain text, as properties and examples.

Fingerprints: the same JSON value in any key order or number spelling is the same
request; strings (Unicode normalization included), booleans and distinct numbers are
not; the legacy (pre-canonical) fingerprint still recognises an identical request.
Plain text: :func:`app.core.text.printable` output always encodes as UTF-8, holds no
invisible or bidi character, and turns an escaped JSON document into an equal one; log
records (console and JSON) show hostile values escaped, one record per line.
"""

from __future__ import annotations

import json as stdjson
import os
import random
import unicodedata
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core import json
from app.core.logging import configure_logging
from app.core.settings import Settings
from app.core.text import printable
from app.engine.submit import SubmitRequest

PROPERTY = settings(
    max_examples=int(os.environ.get("TREADLE_HYPOTHESIS_EXAMPLES", "300")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


def _respell(value: Any, rng: random.Random) -> Any:
    """The same JSON value, another spelling: keys shuffled, integral numbers as floats."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _respell(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_respell(v, rng) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53:
        return float(value) if rng.random() < 0.5 else value
    return value


def _request(value: Any, **options: Any) -> SubmitRequest:
    return SubmitRequest(workflow="w", input=value, idempotency_key="k", **options)


@PROPERTY
@given(json_values, st.integers(0, 2**32))
def test_any_spelling_of_a_value_has_one_fingerprint(value: Any, seed: int) -> None:
    other = _respell(value, random.Random(seed))
    assert _request(other).fingerprint() == _request(value).fingerprint()


@PROPERTY
@given(json_values, json_values)
def test_different_values_have_different_fingerprints(a: Any, b: Any) -> None:
    if json.canonical_dumps(a) != json.canonical_dumps(b):
        assert _request(a).fingerprint() != _request(b).fingerprint()


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"x": 1, "y": {"b": 2, "a": 1}}, {"y": {"a": 1, "b": 2}, "x": 1}, True),
        (1, 1.0, True),
        (100, 1e2, True),
        (stdjson.loads("1"), stdjson.loads("1e0"), True),
        (stdjson.loads("-0"), stdjson.loads("-0.0"), True),
        (stdjson.loads('{"a": 1, "b": 2}'), stdjson.loads('{"b": 2.0, "a": 1E0}'), True),
        (0, -0.0, True),
        (-0.0, 0.0, True),
        (2.5, 25e-1, True),
        (10**20, 1e20, True),
        (1, True, False),
        (0, False, False),
        (None, 0, False),
        (1, "1", False),
        (1, 1.5, False),
        (12345678901234567890, 12345678901234567891, False),
        ([1, 2], [2, 1], False),
        (unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café"), False),
        ("a", "a ", False),
        ({"é": 1}, {unicodedata.normalize("NFD", "é"): 1}, False),
    ],
)
def test_fingerprint_examples(a: Any, b: Any, same: bool) -> None:
    assert (_request(a).fingerprint() == _request(b).fingerprint()) is same


def test_every_option_enters_the_fingerprint() -> None:
    base = _request({"a": 1})
    variants = [
        SubmitRequest(workflow="w2", input={"a": 1}, idempotency_key="k"),
        _request({"a": 1}, version="1"),
        _request({"a": 1}, concurrency_key="c"),
        _request({"a": 1}, delay=1.0),
        _request({"a": 1}, priority=5),
    ]
    prints = {v.fingerprint() for v in variants}
    assert len(prints) == len(variants) and base.fingerprint() not in prints
    # Options in another number form are the same option.
    assert (
        _request({"a": 1}, delay=60).fingerprint() == _request({"a": 1}, delay=60.0).fingerprint()
    )


def test_legacy_fingerprints_still_match_identical_retries() -> None:
    original = _request({"z": 1, "a": [1.0, {"k": "v"}]}, delay=2.5, priority=3)
    stored = original.legacy_fingerprint()
    assert stored != original.fingerprint()  # the canonical form differs (key order)
    identical = _request({"z": 1, "a": [1.0, {"k": "v"}]}, delay=2.5, priority=3)
    assert identical.matches(stored)
    assert identical.matches(original.fingerprint())
    assert not _request({"z": 2, "a": [1.0, {"k": "v"}]}, delay=2.5, priority=3).matches(stored)
    assert not identical.matches(None)


def test_canonical_dumps_handles_deep_nesting_and_refuses_nan() -> None:
    deep: Any = []
    for _ in range(json.MAX_DEPTH):
        deep = [deep]
    assert json.canonical_dumps(deep) == "[" * (json.MAX_DEPTH + 1) + "]" * (json.MAX_DEPTH + 1)
    with pytest.raises(ValueError):
        json.canonical_dumps({"a": float("nan")})


# --- plain text ---------------------------------------------------------------------------

HIDDEN = ["\x00", "\x07", "\x1b", "\r", "\n", "\t", "\x7f", "\x85", "\u200b", "\u200e"]
HIDDEN += ["\u202a", "\u202e", "\u2066", "\u2069", "\u2028", "\u2029", "\ufeff", "\ud800"]
HIDDEN += ["\udfff", "\U000e0001"]


@pytest.mark.parametrize("char", HIDDEN)
def test_printable_escapes_every_hidden_character(char: str) -> None:
    shown = printable(f"a{char}b")
    shown.encode("utf-8")  # never raises
    assert char not in shown
    assert shown.startswith("a\\u") and shown.endswith("b")


def test_printable_keeps_visible_text_and_chosen_characters() -> None:
    for text in ["plain", "café 日本語 🚀", "C:\\path\\file", "non\u00a0breaking", "Ωμέγα"]:
        assert printable(text) == text
    assert printable("line 1\nline 2\x1b", keep="\n") == "line 1\nline 2\\u001b"
    assert printable("\U000e0001") == "\\udb40\\udc01"  # astral: a JSON surrogate pair


@PROPERTY
@given(st.text(st.characters(exclude_categories=())))  # lone surrogates included
def test_printable_output_always_encodes_and_shows_everything(text: str) -> None:
    shown = printable(text)
    shown.encode("utf-8")
    assert all(unicodedata.category(c) not in {"Cc", "Cf", "Cs", "Zl", "Zp"} for c in shown), shown


@PROPERTY
@given(json_values)
def test_printable_json_is_equal_json(value: Any) -> None:
    text = stdjson.dumps(value, ensure_ascii=False, indent=2)
    shown = printable(text, keep="\n")
    assert stdjson.loads(shown) == stdjson.loads(text)


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_log_records_show_hostile_values_escaped(
    log_format: str, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    # The console renderer has no escapes of its own: a value must not forge a record.
    settings = Settings(log_format=log_format, data_dir=tmp_path)
    try:
        configure_logging(settings)
        structlog.get_logger("t").warning(
            "step failed\nforged record", error="lone \ud800 ESC \x1b[2J RTL \u202e NUL \x00"
        )
        err = capsys.readouterr().err
    finally:
        structlog.reset_defaults()
    err.encode("utf-8")
    for raw in ("\ud800", "\x1b", "\u202e", "\x00"):
        assert raw not in err, (log_format, repr(raw))
    assert err.count("\n") == 1, err  # one record, one line: nothing forged
    assert "forged record" in err


@PROPERTY
@given(json_values, st.integers(0, 2**32))
def test_a_plain_input_fingerprints_as_any_input(value: Any, seed: int) -> None:
    # The batch path skips the canonical copy of an input check_depth found plain; the
    # fingerprint must be the one POST /runs computes (respelt: floats in half the ints).
    for candidate in (value, _respell(value, random.Random(seed))):
        request = _request(candidate, delay=2.0, priority=3)
        plain = json.check_depth(candidate, "input")
        assert request.fingerprint(plain_input=plain) == request.fingerprint()


def test_check_depth_calls_floats_and_odd_keys_not_plain() -> None:
    assert json.check_depth({"a": [1, "x", None, True, {"b": 2**70}]}, "input") is True
    assert json.check_depth({"a": [1, 2.0]}, "input") is False
    assert json.check_depth({"a": {1: "x"}}, "input") is False
    assert json.check_depth({"a": (1, 2.0)}, "input") is False
    assert json.encode_limited({"a": 1.5}, 100, "input") == ('{"a":1.5}', False)
    # Trusting a float input as plain would change the fingerprint: the flag matters.
    request = _request({"a": 1.0})
    assert request.fingerprint(plain_input=True) != request.fingerprint()
