"""The start form generator (app.console.schema_form): fields, skeletons, built input."""

from __future__ import annotations

import json

import pytest

from app.console import schema_form as sf
from tests.console.pages.form_handlers import FormInput


def test_fields_cover_simple_kinds_and_fall_back_to_json() -> None:
    fields = sf.fields_for(FormInput.model_json_schema())
    assert fields is not None
    kinds = {f.name: (f.kind, f.required) for f in fields}
    assert kinds == {
        "title": ("string", True),
        "count": ("integer", True),
        "ratio": ("number", False),
        "urgent": ("boolean", False),
        "color": ("enum", False),  # behind a $ref
        "tags": ("json", False),
        "address": ("json", True),  # nested object behind a $ref
        "note": ("string", False),  # anyOf [string, null]
    }
    by_name = {f.name: f for f in fields}
    assert by_name["color"].options == [('"red"', "red"), ('"green"', "green")]
    assert by_name["color"].default == '"green"'
    assert by_name["address"].default == '{\n  "street": "",\n  "zip_code": ""\n}'
    assert by_name["tags"].default == "[]"


@pytest.mark.parametrize("schema", [{}, {"type": "array"}, {"type": "object"}, True, None])
def test_no_form_for_schemas_that_are_not_objects_with_properties(schema: object) -> None:
    assert sf.fields_for(schema) is None


def test_build_input_types_and_leaves_out_empty_fields() -> None:
    fields = sf.fields_for(FormInput.model_json_schema())
    assert fields is not None
    names = {f.name: f.input_name for f in fields}
    typed = {
        names["title"]: " padded ",
        names["count"]: "7",
        names["ratio"]: "",
        names["urgent"]: "true",
        names["color"]: '"red"',
        names["tags"]: '["a"]',
        names["address"]: '{"street": "Main", "zip_code": "1"}',
        names["note"]: "",
    }
    assert sf.build_input(typed, fields) == {
        "title": " padded ",
        "count": 7,
        "urgent": True,
        "color": "red",
        "tags": ["a"],
        "address": {"street": "Main", "zip_code": "1"},
    }
    # Not a number: sent as typed, so the API's schema check names the field.
    assert sf.build_input({names["count"]: "seven"}, fields) == {"count": "seven"}
    with pytest.raises(sf.FormInputError, match="Address is not valid JSON"):
        sf.build_input({names["address"]: "{street"}, fields)


def test_whole_input_textarea() -> None:
    assert sf.whole_skeleton({"type": "array", "items": {"type": "string"}}) == "[]"
    assert sf.build_input({sf.WHOLE: " [1, 2] "}, None) == [1, 2]
    assert sf.build_input({sf.WHOLE: ""}, None) is None
    with pytest.raises(sf.FormInputError, match="not valid JSON"):
        sf.build_input({sf.WHOLE: "[1,"}, None)


def test_ref_loops_do_not_hang() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}},
        "$defs": {"A": {"$ref": "#/$defs/A"}},
    }
    fields = sf.fields_for(schema)
    assert fields is not None and fields[0].kind == "json"


@pytest.mark.parametrize("typed", ["nan", "NaN", "inf", "-Infinity", "1e999", "9" * 5000])
def test_numbers_json_cannot_carry_go_to_the_api_as_typed(typed: str) -> None:
    # Encoding them would fail the request (500): sent as text, the API's schema check
    # refuses the field by name instead.
    fields = sf.fields_for(FormInput.model_json_schema())
    assert fields is not None
    names = {f.name: f.input_name for f in fields}
    for field in ("ratio", "count"):
        built = sf.build_input({names[field]: typed}, fields)
        assert built == {field: typed}
        json.dumps(built, allow_nan=False)  # the client's encoding of it cannot fail


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"x": -Infinity}', "9" * 5000])
def test_json_textareas_refuse_what_json_cannot_carry(text: str) -> None:
    fields = sf.fields_for(FormInput.model_json_schema())
    assert fields is not None
    names = {f.name: f.input_name for f in fields}
    with pytest.raises(sf.FormInputError, match="nothing was submitted"):
        sf.build_input({sf.WHOLE: text}, None)
    with pytest.raises(sf.FormInputError, match=r"^Tags holds a number JSON cannot carry"):
        sf.build_input({names["tags"]: text}, fields)
