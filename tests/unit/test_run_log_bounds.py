"""Bounds of one ``ctx.logger`` line (app/engine/logbook.py): message and fields."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

from app.engine.logbook import bound_fields, bound_message


def test_a_long_message_is_cut_with_a_marker() -> None:
    assert bound_message("abc", 3) == "abc"
    assert bound_message("abcdef", 3) == "abc… [3 more characters]"
    assert bound_message(12345, 10) == "12345"  # not a str: its str()


def test_fields_are_json_whatever_they_hold() -> None:
    assert bound_fields({}, 100) is None
    when = datetime(2026, 12, 1, tzinfo=UTC)
    text = bound_fields({"n": 1, "when": when, "nan": math.nan, "nul": "a\x00b"}, 1000)
    assert text is not None and text.isascii()
    decoded = json.loads(text)
    assert decoded["n"] == 1 and decoded["nul"] == "a\x00b"
    assert decoded["when"] == repr(when)
    assert decoded["nan"] == "nan"  # NaN is not JSON: that value alone becomes its repr
    cyclic: list[object] = []
    cyclic.append(cyclic)
    assert json.loads(bound_fields({"loop": cyclic, "ok": [1]}, 1000) or "") == {
        "loop": "[[...]]",
        "ok": [1],
    }


def test_fields_over_the_bound_become_a_preview() -> None:
    text = bound_fields({"big": "y" * 5000}, 1000)
    assert text is not None and len(text) < 1000
    decoded = json.loads(text)
    assert decoded["_truncated"] is True
    assert decoded["_bytes"] > 5000
    assert decoded["_preview"].startswith('{"big":"yyy')
