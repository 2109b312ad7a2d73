"""JSON a person types (console fields, CLI options) is read under the API's rules.

:func:`app.core.json.parse_text` refuses what a request body or payload would be refused
for, so a console or CLI never re-encodes a refused value into an accepted one; the
client's body encoder (:func:`app.client._http.encode_body`) refuses what JSON cannot
carry before sending; workflow durations are bounded (:func:`check_seconds`).
"""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from app.cli.main import app as cli
from app.client import InvalidBody
from app.client._http import Call, encode_body
from app.core.errors import InvalidInput
from app.core.json import MAX_DEPTH, parse_text
from app.engine.context import MAX_WAIT_SECONDS, check_seconds

REFUSED = {
    "not JSON": ('{"a": 1,', "is not valid JSON (line 1"),
    "repeated key, nested": ('{"a": {"b": 1, "b": 2}}', "repeats the key 'b'"),
    "NaN": ('{"a": NaN}', "a number JSON cannot carry"),
    "Infinity": ("[-Infinity]", "a number JSON cannot carry"),
    "huge integer": ("9" * 5000, "a number JSON cannot carry"),
    "lone surrogate": ('"\\ud800"', "lone surrogate"),
    "too deep for the parser": ("[" * 3000 + "]" * 3000, "nested deeper than"),
    "deeper than the payload limit": (
        "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
        "nested deeper than",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_parse_text_refuses_what_the_api_refuses(case: str) -> None:
    text, fragment = REFUSED[case]
    with pytest.raises(InvalidInput) as caught:
        parse_text(text, "The payload")
    assert caught.value.detail.startswith("The payload"), caught.value.detail
    assert fragment in caught.value.detail, caught.value.detail


def test_parse_text_keeps_what_the_api_keeps() -> None:
    text = '{"a": [1, 2.5, "é\\u0000", null, true], "big": 123456789012345678901234567890}'
    assert parse_text(text, "x") == {
        "a": [1, 2.5, "é\x00", None, True],
        "big": 123456789012345678901234567890,
    }


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_cli_json_options_are_one_line_refusals(case: str) -> None:
    # No server is needed: the option is read before any request (exit 2, usage).
    text, fragment = REFUSED[case]
    done = CliRunner().invoke(
        cli, ["runs", "start", "wf", "--input", text, "--url", "http://127.0.0.1:9"]
    )
    assert done.exit_code == 2, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.output, done.output
    assert "--input" in lines[0] and fragment in lines[0], lines[0]


class Notes(BaseModel):
    items: list[str]
    first: str = Field(alias="First")


def test_the_client_encodes_models_and_escapes_what_utf8_cannot_carry() -> None:
    assert encode_body({"n": Notes(items=["a"], First="x")}) == b'{"n":{"items":["a"],"First":"x"}}'
    # Escaped, so the API answers it (422) instead of httpx failing to encode it.
    assert encode_body({"s": "\ud800é"}) == b'{"s":"\\ud800\\u00e9"}'


@pytest.mark.parametrize("body", [{"a": math.nan}, [math.inf], {"x": object()}, {"f": lambda: 1}])
def test_the_client_refuses_a_body_json_cannot_carry(body: object) -> None:
    with pytest.raises(InvalidBody, match="nothing was sent"):
        encode_body(body)


def test_the_client_refuses_a_body_too_deep_to_encode() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidBody, match=r"depth|too deep") as caught:
        encode_body(deep)
    assert "nothing was sent" in caught.value.detail


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -1, 1e300, MAX_WAIT_SECONDS + 1, True, "5", None]
)
def test_durations_out_of_range_are_value_errors_naming_the_call(value: object) -> None:
    with pytest.raises(ValueError, match=r"^sleep duration must"):
        check_seconds(value, "sleep duration", zero=True)  # type: ignore[arg-type]


def test_durations_in_range_are_kept() -> None:
    assert check_seconds(0, "sleep duration", zero=True) == 0
    assert check_seconds(MAX_WAIT_SECONDS, "approval timeout") == MAX_WAIT_SECONDS
    with pytest.raises(ValueError, match=r"^approval timeout must be > 0"):
        check_seconds(0, "approval timeout")


def test_a_call_without_a_body_sends_none() -> None:
    # An optional body left out (cancel without a reason) stays absent, not ``null``.
    assert "content" not in Call("POST", "/runs/x/cancel", body=None).kwargs()
    sent = Call("POST", "/runs/x/cancel", body={"reason": "r"}).kwargs()
    assert sent["content"] == b'{"reason":"r"}'
    assert sent["headers"]["Content-Type"] == "application/json"
