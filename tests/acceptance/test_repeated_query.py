"""A query parameter that takes one value, given twice, is ``422`` on every operation.

Operations and their parameters are read from the app's own OpenAPI document, so a new
operation or parameter is covered without editing this file. For each parameter whose
schema is not an array: given twice, the answer is ``422 invalid_input`` with one
``{"path": "query.<name>", "message": "repeated"}`` error and nothing done; given once
(GET operations), it is not refused that way. An array-typed parameter (none today; the
mechanism's own test has some, ``tests/unit/test_query_params.py``) must take repeats.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from app.api.app import openapi_document
from tests.acceptance.conftest import Stack

_NO_SUCH_ID = "00000000-0000-4000-8000-000000000000"


def _is_array(schema: dict[str, Any]) -> bool:
    if schema.get("type") == "array":
        return True
    return any(_is_array(s) for s in schema.get("anyOf", []) + schema.get("oneOf", []))


def _value(schema: dict[str, Any]) -> str:
    # One valid value of the parameter's type, harmless to act on: false for booleans
    # (``follow=true`` would open a stream), 0 / 1 for numbers.
    for branch in [schema, *schema.get("anyOf", [])]:
        if "enum" in branch:
            return str(branch["enum"][0])
        kind = branch.get("type")
        if kind == "boolean":
            return "false"
        if kind == "integer":
            return str(max(1, int(branch.get("minimum", 1))))
        if kind == "number":
            return "0"
        if kind == "string":
            return "x"
    return "x"


def _operations() -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    document = openapi_document()
    for path, item in document["paths"].items():
        for method, op in item.items():
            query = [p for p in op.get("parameters", []) if p["in"] == "query"]
            if query:
                url = path
                for p in op.get("parameters", []):
                    if p["in"] == "path":
                        url = url.replace("{" + p["name"] + "}", _NO_SUCH_ID)
                yield method.upper(), url, query


def test_every_single_valued_query_parameter_refuses_a_repeat(stack: Stack) -> None:
    operations = list(_operations())
    assert any(m == "GET" for m, _, _ in operations) and len(operations) >= 20  # walked
    with stack.client() as api:
        for method, url, params in operations:
            for p in params:
                name, value = p["name"], _value(p["schema"])
                twice = api.request(method, url, params=[(name, value), (name, value)])
                if _is_array(p["schema"]):
                    assert "repeated" not in twice.text, (method, url, name, twice.text)
                    continue
                where = (method, url, name)
                assert twice.status_code == 422, (*where, twice.status_code, twice.text)
                problem = twice.json()
                assert twice.headers["content-type"] == "application/problem+json", where
                assert problem["code"] == "invalid_input", (*where, problem)
                assert problem["errors"] == [{"path": f"query.{name}", "message": "repeated"}]
                assert problem["detail"] == (
                    f"query parameter {name!r} is given more than once; it takes one value"
                ), where
                if method == "GET":
                    once = api.request(method, url, params=[(name, value)])
                    assert "repeated" not in once.text, (*where, once.status_code, once.text)


def test_repeats_are_named_together_and_label_filters_too(stack: Stack) -> None:
    with stack.client() as api:
        both = api.get(
            "/runs", params=[("limit", "1"), ("workflow", "a"), ("limit", "2"), ("workflow", "b")]
        )
        assert both.status_code == 422, both.text
        assert both.json()["errors"] == [
            {"path": "query.limit", "message": "repeated"},
            {"path": "query.workflow", "message": "repeated"},
        ]
        # label.<key> is no declared parameter: GET /runs refuses its repeats itself, in
        # the same shape.
        label = api.get("/runs", params=[("label.customer", "1"), ("label.customer", "2")])
        assert label.status_code == 422, label.text
        assert label.json()["errors"] == [{"path": "query.label.customer", "message": "repeated"}]
        assert "more than once" in label.json()["detail"]
        # Different label keys, and a parameter once each: fine.
        fine = api.get("/runs", params=[("label.a", "1"), ("label.b", "2"), ("limit", "5")])
        assert fine.status_code == 200, fine.text


def test_a_repeat_refused_before_the_token_is_read(stack: Stack) -> None:
    # Which parameters take one value is public (the OpenAPI document): the refusal needs
    # no token, and a request without one changes nothing either way.
    with httpx.Client(base_url=stack.url, timeout=60) as anon:
        r = anon.get("/runs", params=[("limit", "1"), ("limit", "2")])
        assert r.status_code == 422 and r.json()["code"] == "invalid_input", r.text
        assert anon.get("/runs", params={"limit": "1"}).status_code == 401
