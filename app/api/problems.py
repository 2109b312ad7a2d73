"""The one place domain errors become RFC 9457 ``application/problem+json`` responses."""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.responses import AsciiJSONResponse
from app.core import errors, metrics
from app.core.json import MAX_DEPTH
from app.db.faults import DbFault, classify

log = structlog.get_logger("treadle.api")

PROBLEM_JSON = "application/problem+json"

_STATUS: list[tuple[type[errors.TreadleError], int]] = [
    (errors.NotFoundError, 404),
    (errors.ConflictError, 409),
    (errors.InvalidInput, 422),
    (errors.BadRequest, 400),
    (errors.PayloadTooLarge, 413),
    (errors.Unauthenticated, 401),
    (errors.Forbidden, 403),
    (errors.CeilingExceeded, 422),
    (errors.TooManyRequests, 429),
    (errors.SchemaVersionMismatch, 503),
    (errors.IdentityProviderUnavailable, 503),
]


def _problem_doc(description: str) -> dict[str, Any]:
    # "model" registers the Problem schema; create_app re-labels the media type.
    from app.api.schemas import Problem

    return {"model": Problem, "description": description}


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _problem_doc("Malformed request"),
    401: _problem_doc("Missing or invalid token"),
    403: _problem_doc("Missing scope, or the tenant is suspended (code tenant_suspended)"),
    404: _problem_doc("Not found (for this tenant)"),
    422: _problem_doc("Invalid request"),
    431: _problem_doc("Request headers over TREADLE_MAX_HEADER_BYTES"),
    503: _problem_doc(
        "Database unavailable, busy, timed out or conflicting, schema not at head, or the "
        "identity provider's keys cannot be loaded; retry after Retry-After"
    ),
}
"""OpenAPI ``responses=`` shared by every authenticated route."""

HEADERS_TOO_LARGE: dict[int | str, dict[str, Any]] = {431: PROBLEM_RESPONSES[431]}
"""The one problem any route answers, probes included (``request_guards.RequestGuards``)."""


def problem_media_type(schema: dict[str, Any]) -> dict[str, Any]:
    """Declare every 4xx/5xx JSON body of an OpenAPI document as ``application/problem+json``.

    FastAPI documents ``responses={…: {"model": Problem}}`` as ``application/json``; the
    server sends RFC 9457 problems, so generated SDKs must see the real media type.
    """
    for item in schema.get("paths", {}).values():
        for op in item.values():
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                if str(status)[0] not in "45" or not content:
                    continue
                # A route with a text response class documents its errors as text/plain
                # too: whatever the media type FastAPI chose, errors are problems.
                body = content.get("application/json") or next(iter(content.values()))
                response["content"] = {PROBLEM_JSON: body}
    return schema


_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def status_for(exc: errors.TreadleError) -> int:
    """HTTP status of a domain error (first matching class in the table)."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def problem(
    status: int,
    code: str,
    detail: str,
    *,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """Build a problem+json response; ``type`` is ``urn:treadle:problem:<code>``."""
    body = problem_body(status, code, detail, instance=instance, **extra)
    # ASCII-escaped like every JSON view: a detail quoting a lone surrogate still encodes.
    return AsciiJSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def problem_body(
    status: int, code: str, detail: str, *, instance: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The RFC 9457 members of a problem (what :func:`problem` sends), as a dict.

    Also the per-item ``problem`` of ``POST /runs:batch`` results (docs/api.md).
    """
    # Standard members win over error data that happens to reuse a name.
    body: dict[str, Any] = {
        **extra,
        "type": f"urn:treadle:problem:{code}",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance is not None:
        body["instance"] = instance
    return body


async def _treadle_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.TreadleError)
    status = status_for(exc)
    headers = None
    if isinstance(exc, errors.Unauthenticated):
        # RFC 6750 §3: tell the client which scheme and why.
        headers = {"WWW-Authenticate": 'Bearer realm="treadle", error="invalid_token"'}
    if status == 503:
        headers = {"Retry-After": "5"}
    if status == 429:
        headers = {"Retry-After": str(exc.data.get("retry_after_seconds", 1))}
    return problem(
        status, exc.code, exc.detail, instance=request.url.path, headers=headers, **exc.data
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    items = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in items):
        return problem(
            400, "malformed_json", "request body is not valid JSON", instance=request.url.path
        )
    return problem(
        422,
        "invalid_request",
        "request does not match the API schema",
        instance=request.url.path,
        errors=[
            {
                "path": ".".join(str(p) for p in e.get("loc", ())),
                "message": str(e.get("msg", "invalid")),
            }
            for e in items[:20]
        ],
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    # FastAPI turns any body-parsing failure other than a JSON syntax error into a generic
    # 400 "There was an error parsing the body", chaining the cause: name the two causes
    # a client can send like every other invalid payload.
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        return problem(
            422,
            "invalid_input",
            f"request body is nested deeper than {MAX_DEPTH} levels",
            instance=request.url.path,
            errors=[{"path": "$", "message": f"nesting over {MAX_DEPTH} levels"}],
        )
    if isinstance(cause, UnicodeDecodeError):
        return problem(
            400, "malformed_json", "request body is not valid UTF-8", instance=request.url.path
        )
    code = {
        404: "not_found",
        405: "method_not_allowed",
        408: "request_timeout",
        413: "payload_too_large",
    }.get(exc.status_code, "http_error")
    return problem(
        exc.status_code,
        code,
        str(exc.detail),
        instance=request.url.path,
        headers=getattr(exc, "headers", None),
    )


# Every transient database fault is a 503 with Retry-After: the request changed nothing
# (its transaction rolled back) and the same request succeeds once the fault clears.
_FAULT_PROBLEMS: dict[DbFault, tuple[str, str]] = {
    DbFault.UNAVAILABLE: ("database_unavailable", "the database is unavailable; retry shortly"),
    DbFault.POOL_TIMEOUT: (
        "database_busy",
        "every database connection of this server is busy; retry shortly",
    ),
    DbFault.STATEMENT_TIMEOUT: (
        "database_timeout",
        "a database statement took longer than the statement timeout; retry shortly",
    ),
    DbFault.LOCK_TIMEOUT: (
        "database_timeout",
        "a database lock was not granted within the lock timeout; retry shortly",
    ),
    DbFault.OBJECT_STATE: (
        "database_conflict",
        "a database object was in use by concurrent work; retry shortly",
    ),
    DbFault.INSUFFICIENT_RESOURCES: (
        "database_unavailable",
        "the database is out of a resource (disk, memory, connections); retry later",
    ),
    DbFault.SYSTEM_ERROR: (
        "database_unavailable",
        "the database reported a system error; retry later",
    ),
    DbFault.TRANSACTION_ROLLBACK: (
        "database_conflict",
        "the database rolled the request's transaction back; retry shortly",
    ),
    DbFault.OTHER: (
        "database_unavailable",
        "the database could not complete the request; retry later",
    ),
    DbFault.DEADLOCK: (
        "database_conflict",
        "the request kept conflicting with concurrent work (deadlock); retry shortly",
    ),
    DbFault.SERIALIZATION_FAILURE: (
        "database_conflict",
        "the request kept conflicting with concurrent work (serialization failure); retry shortly",
    ),
    DbFault.LOCKED: (
        "database_conflict",
        "the database stayed locked by concurrent work; retry shortly",
    ),
}
DB_FAULT_RETRY_AFTER = "2"
"""``Retry-After`` seconds of every transient database fault (503)."""


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    fault = classify(exc)
    if fault is None:
        return await _unexpected(request, exc)
    metrics.DB_FAULTS.labels(fault.value).inc()
    # The log (operators only) keeps the statement; the response never carries SQL.
    log.warning("database fault", fault=fault.value, path=request.url.path, error=str(exc)[:300])
    code, detail = _FAULT_PROBLEMS[fault]
    return problem(
        503,
        code,
        detail,
        instance=request.url.path,
        headers={"Retry-After": DB_FAULT_RETRY_AFTER},
    )


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    if classify(exc) is not None:
        # A driver error SQLAlchemy did not wrap (asyncpg finding no read-write host of a
        # multi-host URL mid-failover): a database fault, 503, not a bug.
        return await _database_error(request, exc)
    log.exception("unhandled error", path=request.url.path)
    return problem(
        500, "internal_error", "internal error; it has been logged", instance=request.url.path
    )


def install(app: FastAPI) -> None:
    """Register every exception handler on ``app``."""
    app.add_exception_handler(errors.TreadleError, _treadle_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    # DBAPIError covers OperationalError; errors that are no transient fault are a 500.
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(PoolTimeout, _database_error)
    app.add_exception_handler(ConnectionError, _database_error)
    app.add_exception_handler(Exception, _unexpected)
