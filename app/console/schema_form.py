"""A start-run form generated from a workflow version's input JSON Schema.

Covered: a top-level ``object`` whose properties are ``string``, ``integer``, ``number``,
``boolean`` or ``enum`` (also behind a local ``$ref`` or an ``anyOf`` with ``null``, as
Pydantic writes optional fields and enums). Each becomes a labelled input, required ones
marked. Any other property (nested object, array, union) becomes a JSON textarea
pre-filled with a skeleton of its schema; a schema that is not such an object becomes one
textarea for the whole input. The API validates the built input against the schema; this
module only turns form text into JSON (docs/console.md, "Start a run").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.datastructures import FormData

from app.console.web import form_text
from app.core.errors import InvalidInput
from app.core.json import parse_text

FieldKind = Literal["string", "integer", "number", "boolean", "enum", "json"]
MAX_FIELD_CHARS = 1_000_000
WHOLE = "input_json"
"""Form name of the single textarea used when the schema has no form."""


@dataclass(frozen=True, slots=True)
class FormField:
    """One input of the generated form.

    Attributes:
        name: the property name in the input object.
        input_name: the HTML ``name``/``id`` (``f<index>``: property names can be any text).
        kind: which input it is; ``json`` is a textarea taking JSON.
        required: listed in the schema's ``required``.
        label: the schema's ``title`` or the property name.
        description: the schema's ``description`` ("" if none).
        default: the form's initial text.
        options: for ``enum``: the allowed values as (JSON text sent back, text shown).
    """

    name: str
    input_name: str
    kind: FieldKind
    required: bool
    label: str
    description: str = ""
    default: str = ""
    options: list[tuple[str, str]] = field(default_factory=list)


class FormInputError(ValueError):
    """Form text that is not JSON where JSON is needed; the message names the field."""


def _resolve(schema: Any, root: dict[str, Any], depth: int = 0) -> Any:
    # Follow a local "#/$defs/X" (or "#/definitions/X") reference; a loop or anything
    # else is left alone (it then falls back to a JSON textarea).
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and depth < 20:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            return schema
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        if not isinstance(target, dict):
            return schema
        extra = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **extra}
        depth += 1
    return schema


def _unwrap_optional(schema: Any, root: dict[str, Any]) -> tuple[Any, bool]:
    # Pydantic's ``X | None``: anyOf [X, {"type": "null"}]. Returns (X, nullable).
    schema = _resolve(schema, root)
    if isinstance(schema, dict):
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list):
                rest = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
                if len(rest) == 1 and len(rest) < len(options):
                    merged = {
                        **_resolve(rest[0], root),
                        **{k: v for k, v in schema.items() if k not in (key,)},
                    }
                    return merged, True
    return schema, False


def skeleton(schema: Any, root: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A JSON value shaped like ``schema``: its default, else an empty value of its type.

    Objects list every property (recursively, to a depth of 8); arrays are empty.
    """
    root = root if root is not None else (schema if isinstance(schema, dict) else {})
    schema, _ = _unwrap_optional(schema, root)
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "default" in schema:
        return schema["default"]
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or "properties" in schema:
        props = schema.get("properties")
        if not isinstance(props, dict):
            return {}
        return {k: skeleton(v, root, depth + 1) for k, v in props.items()}
    return {"array": [], "string": "", "integer": 0, "number": 0, "boolean": False}.get(str(kind))


def _text(value: Any, kind: FieldKind) -> str:
    if value is None:
        return ""
    if kind == "json":
        return json.dumps(value, indent=2, ensure_ascii=False)
    if kind == "boolean":
        return "true" if value is True else ("false" if value is False else "")
    if kind == "enum":
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def fields_for(schema: Any) -> list[FormField] | None:
    """The form for ``schema``, or None when it is not an object with properties.

    Args:
        schema: the workflow version's ``input_schema`` as GET /workflows gives it.
    """
    if not isinstance(schema, dict):
        return None
    root = schema
    top = _resolve(schema, root)
    props = top.get("properties") if isinstance(top, dict) else None
    if not isinstance(props, dict) or not props or top.get("type", "object") != "object":
        return None
    required = set(top.get("required") or [])
    out: list[FormField] = []
    for index, (name, raw) in enumerate(props.items()):
        prop, _ = _unwrap_optional(raw, root)
        prop = prop if isinstance(prop, dict) else {}
        kind: FieldKind
        options: list[tuple[str, str]] = []
        ptype = prop.get("type")
        if isinstance(prop.get("enum"), list) and prop["enum"]:
            kind = "enum"
            options = [(json.dumps(o, ensure_ascii=False), str(o)) for o in prop["enum"]]
        elif ptype in ("string", "integer", "number", "boolean"):
            kind = ptype
        else:
            kind = "json"
        default = prop.get("default") if "default" in prop else None
        if kind == "json" and default is None:
            default = skeleton(prop, root)
        out.append(
            FormField(
                name=str(name),
                input_name=f"f{index}",
                kind=kind,
                required=name in required,
                label=str(prop.get("title") or name),
                description=str(prop.get("description") or ""),
                default=_text(default, kind),
                options=options,
            )
        )
    return out


def whole_skeleton(schema: Any) -> str:
    """The single textarea's initial text: :func:`skeleton` of the whole schema as JSON."""
    return json.dumps(skeleton(schema), indent=2, ensure_ascii=False)


def typed_values(form: FormData, fields: list[FormField] | None) -> dict[str, str]:
    """What the user typed, by ``input_name`` (to show the form again unchanged).

    A field over ``MAX_FIELD_CHARS`` raises ``FormFieldTooLong`` (refused whole, never cut).
    """
    names = [f.input_name for f in fields] if fields is not None else [WHOLE]
    return {
        n: form_text(form, n, max_chars=MAX_FIELD_CHARS)
        for n in names
        if isinstance(form.get(n), str)
    }


def _number(text: str, integer: bool) -> Any:
    # Text that is no number goes to the API as the string it is: the API's schema
    # validation then names the field and says what it wanted. So does a number JSON
    # cannot carry (nan, inf, 1e999) or Python will not convert (over 4300 digits):
    # it would otherwise fail the request's own encoding (500).
    try:
        return int(text)
    except ValueError:
        if integer:
            return text
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def _parse_json(text: str, what: str) -> Any:
    """``text`` decoded under the API's JSON rules (:func:`app.core.json.parse_text`).

    Raises:
        FormInputError: why, naming ``what``; nothing was submitted.
    """
    try:
        return parse_text(text, what)
    except InvalidInput as exc:
        raise FormInputError(f"{exc.detail}; nothing was submitted.") from None


def build_input(values: dict[str, str], fields: list[FormField] | None) -> Any:
    """The run input the form describes.

    Empty fields are left out (the schema's default or its "required" error applies);
    enum fields carry the JSON of the chosen option; boolean selects give true/false.

    Raises:
        FormInputError: a JSON textarea does not hold JSON (the message names it).
    """
    if fields is None:
        text = values.get(WHOLE, "").strip()
        if not text:
            return None
        return _parse_json(text, "The input")
    out: dict[str, Any] = {}
    for f in fields:
        text = values.get(f.input_name, "")
        if f.kind != "string":
            text = text.strip()
        if text == "":
            continue
        if f.kind == "string":
            out[f.name] = text
        elif f.kind in ("integer", "number"):
            out[f.name] = _number(text, f.kind == "integer")
        elif f.kind == "boolean":
            out[f.name] = {"true": True, "false": False}.get(text, text)
        else:
            out[f.name] = _parse_json(text, f.label)
    return out
