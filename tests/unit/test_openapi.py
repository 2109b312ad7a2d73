"""The committed OpenAPI document is current, and documents every operation and its errors.

No database: the document is rendered from the application's routes.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.api.openapi import render

SPEC_PATH = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
SPEC: dict[str, Any] = json.loads(SPEC_PATH.read_text())
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
OPERATIONS: dict[str, tuple[str, str, dict[str, Any]]] = {
    op["operationId"]: (method.upper(), path, op)
    for path, item in SPEC["paths"].items()
    for method, op in item.items()
    if method in HTTP_METHODS and "operationId" in op
}
PROBLEM_REF = "#/components/schemas/Problem"
# Health probes take no token and answer with a Health body (503 when not ready); the
# Prometheus endpoint takes no token either (scrapers are restricted at the network).
PROBES = {"get_health", "get_readiness", "get_metrics"}


def problem_statuses(op: dict[str, Any]) -> set[str]:
    """Statuses of ``op`` whose declared body (in any media type) is the Problem schema."""
    return {
        status
        for status, response in op.get("responses", {}).items()
        if any(
            content.get("schema", {}).get("$ref") == PROBLEM_REF
            for content in response.get("content", {}).values()
        )
    }


def test_committed_spec_matches_the_app() -> None:
    rendered = render()
    committed = SPEC_PATH.read_text()
    if committed != rendered:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    rendered.splitlines(keepends=True),
                    "openapi/openapi.json (committed)",
                    "app.api.openapi.render()",
                )
            )[:60]
        )
        pytest.fail(f"openapi/openapi.json is stale: run `make openapi` and commit it.\n{diff}")


def test_every_operation_has_an_id_and_documentation() -> None:
    count = 0
    for path, item in SPEC["paths"].items():
        for method, op in item.items():
            if method not in HTTP_METHODS:
                continue
            count += 1
            where = f"{method.upper()} {path}"
            assert op.get("operationId"), f"{where} has no operationId"
            assert (op.get("summary") or "").strip(), f"{where} has no summary"
            assert (op.get("description") or "").strip(), f"{where} has no description"
    assert count == len(OPERATIONS), "operationIds must be unique"
    assert OPERATIONS, "no operations found"


def _secured(op: dict[str, Any]) -> bool:
    # An operation's own `security` (even an empty list) replaces the document's.
    return bool(op["security"] if "security" in op else SPEC.get("security"))


def _cases() -> list[str]:
    return sorted(op_id for op_id in OPERATIONS if op_id not in PROBES)


@pytest.mark.parametrize("operation_id", _cases())
def test_every_operation_declares_problem_responses(operation_id: str) -> None:
    method, path, op = OPERATIONS[operation_id]
    where = f"{method} {path} ({operation_id})"
    declared = problem_statuses(op)
    assert _secured(op), f"{where} is not marked as needing a bearer token"
    assert {"401", "403"} <= declared, f"{where}: 401/403 must be Problem responses: {declared}"
    if "{run_id}" in path:
        assert "404" in declared, f"{where}: unknown run ids are 404 problems"
    if op.get("parameters") or op.get("requestBody"):
        assert "422" in declared, f"{where}: invalid requests are 422 problems"
    for status, response in op["responses"].items():
        if int(status) >= 400:
            assert status in declared, f"{where}: {status} is not a Problem: {response}"


def test_probes_need_no_token_and_declare_no_problems() -> None:
    assert SPEC["security"] == [{"HTTPBearer": []}], "the document requires the bearer token"
    for op_id in PROBES:
        method, path, op = OPERATIONS[op_id]
        assert op["security"] == [], f"{method} {path} must say `security: []` (no token)"
        assert not _secured(op), f"{method} {path} must not need a token"
        # Only the header ceiling (431, any route) is a problem; 200/503 are Health bodies.
        assert problem_statuses(op) == {"431"}, f"{method} {path}: {problem_statuses(op)}"


def test_document_names_its_servers_license_and_every_operation_needs_a_4xx() -> None:
    assert SPEC["servers"] and SPEC["servers"][0]["url"].startswith("http")
    assert SPEC["info"]["license"]["identifier"] == "Apache-2.0"
    for method, path, op in OPERATIONS.values():
        assert any(s.startswith("4") for s in op["responses"]), f"{method} {path}: no 4xx"


def test_each_operation_has_one_answer_type_for_generators() -> None:
    # Generators (openapi-python-client, openapi-fetch) take one media type per answer:
    # the text report is its own operation, so a typed client can call it.
    _, path, op = OPERATIONS["get_run_report_text"]
    assert path == "/runs/{run_id}/report.txt"
    assert list(op["responses"]["200"]["content"]) == ["text/plain"]
    _, _, report = OPERATIONS["get_run_report"]
    assert next(iter(report["responses"]["200"]["content"])) == "application/json"
    assert "format" not in {p["name"] for p in report.get("parameters", [])}


def _walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_schemas_have_no_illogical_any_of_and_examples_validate() -> None:
    from jsonschema import Draft202012Validator

    for node in _walk(SPEC["components"]["schemas"]):
        if isinstance(node, dict) and "anyOf" in node:
            assert {} not in node["anyOf"], f"anyOf with an empty (any) schema: {node}"
    # Examples must validate against their schema (refs resolved inside the document).
    for name, schema in SPEC["components"]["schemas"].items():
        for example in schema.get("examples", []):
            validator = Draft202012Validator(
                {**schema, "components": SPEC["components"]},
            )
            errors = [e.message for e in validator.iter_errors(example)]
            assert not errors, f"{name} example is invalid: {errors}"


def test_problem_responses_declare_the_problem_media_type() -> None:
    wrong = {
        f"{method} {path} {status}": sorted(response.get("content", {}))
        for method, path, op in OPERATIONS.values()
        for status, response in op["responses"].items()
        if status in problem_statuses(op)
        and set(response.get("content", {})) != {"application/problem+json"}
    }
    assert not wrong, f"problem responses not declared as application/problem+json: {wrong}"


def test_spec_is_valid_openapi() -> None:
    from openapi_spec_validator import validate

    assert SPEC["openapi"].startswith("3.1")
    validate(SPEC)  # raises OpenAPIValidationError naming the offending path
    broken = json.loads(json.dumps(SPEC))
    broken["paths"]["/runs"]["post"]["responses"]["201"]["content"]["application/json"][
        "schema"
    ] = {"$ref": "#/components/schemas/NoSuchModel"}
    with pytest.raises(Exception, match="NoSuchModel"):
        validate(broken)
