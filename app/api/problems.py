"""The one place domain errors become RFC 9457 ``application/problem+json`` responses.

Every exception handler builds a :class:`Problem` (status, code, detail, headers, extra
members); :class:`ProblemPages` sends it as ``application/problem+json``, or, for a path
under a prefix that registered a renderer (the console's ``/ui``, wired by
:func:`app.api.app.create_app`), as that renderer's page: a browser never gets JSON for
an HTML page's error. The API never imports the renderer's package: it is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
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


@dataclass(frozen=True)
class Problem:
    """One problem to answer: what :func:`problem` takes, before it is rendered.

    ``status`` is the HTTP status, ``code`` the stable ``urn:treadle:problem:<code>``
    suffix, ``detail`` the sentence for people, ``headers`` extra response headers
    (``Retry-After``, ``WWW-Authenticate``, ``Connection: close``), ``extra`` the
    problem's extra members (``errors``, ``limit_bytes``…).
    """

    status: int
    code: str
    detail: str
    headers: Mapping[str, str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def body(self, instance: str | None) -> dict[str, Any]:
        """The RFC 9457 members (:func:`problem_body`) with ``instance``."""
        return problem_body(self.status, self.code, self.detail, instance=instance, **self.extra)


ProblemPage = Callable[[Request, Mapping[str, Any], Mapping[str, str] | None], Awaitable[Response]]
"""A renderer of problems for the paths under one prefix: ``(request, body, headers)``.

``body`` is the problem's RFC 9457 members (``status``, ``title``, ``detail``, ``code``,
``instance``, extras such as ``errors``); ``headers`` the ones the answer must carry. The
renderer returns the whole response (its status should be ``body["status"]``).
"""


class ProblemPages:
    """Renders problems as JSON, or as a registered page under a path prefix.

    ``pages`` maps a path prefix (``"/ui"``: that path and everything under ``/ui/``) to
    its :data:`ProblemPage`; every other path gets ``application/problem+json``. Shared
    by the exception handlers (:func:`install`) and the request guards
    (:class:`app.api.request_guards.RequestGuards`), so every refusal of one path has
    one media type whichever layer refused it.
    """

    def __init__(self, pages: Mapping[str, ProblemPage] | None = None) -> None:
        self._pages = {prefix.rstrip("/"): page for prefix, page in (pages or {}).items()}

    def page_for(self, path: str) -> ProblemPage | None:
        """The renderer registered for ``path``, or None (JSON)."""
        for prefix, page in self._pages.items():
            if path == prefix or path.startswith(prefix + "/"):
                return page
        return None

    async def respond(self, request: Request, found: Problem) -> Response:
        """Answer ``found`` for ``request``: the path's page, else problem+json.

        A renderer that fails is logged and the problem goes out as JSON: an error page
        must never turn one error into another.
        """
        path = request.url.path
        page = self.page_for(path)
        if page is not None:
            try:
                return await page(request, found.body(path), found.headers)
            except Exception:
                log.exception("problem page failed; answering JSON", path=path)
        return problem(
            found.status,
            found.code,
            found.detail,
            instance=path,
            headers=dict(found.headers) if found.headers else None,
            **found.extra,
        )


async def _treadle_error(request: Request, exc: Exception) -> Problem:
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
    return Problem(status, exc.code, exc.detail, headers, exc.data)


# A union member's tag in a pydantic error location ("int",
# "function-after[checked_text(), constrained-str]"): pydantic's name for a branch of the
# type, not a field the client sent.
_UNION_TAG = re.compile(
    r"^(int|str|float|bool|none|nullable)$|[\[\]()]|^constrained-|^[a-z]+-[a-z]+"
)

FIELD_RULES: dict[str, str] = {
    "version": "must be a workflow definition version: a whole number, or text of 1 to 64 "
    "printable characters",
    "delay": f"must be a number of seconds from 0 to {366 * 86400} (not NaN or infinite)",
    "wait": "must be a number of seconds from 0 to 300 (not NaN or infinite)",
}
"""The rule of a field, in user terms, keyed by its name (the last segment of its path).

A field named here that fails validation gets this sentence as its message instead of
pydantic's (which, for a field that takes one of several types, names each of pydantic's
internal branch types). A field not named keeps pydantic's message, which for a single
type already states the rule ("Input should be less than or equal to 100").
"""


def validation_items(raw: list[Any]) -> list[dict[str, str]]:
    """Client-facing ``{path, message}`` items of pydantic errors, at most 20.

    The path is the dotted location the client sent (``body.delay``), without pydantic's
    union-branch tags; the errors of one field (one per branch of a union type) become one
    item; a field of :data:`FIELD_RULES` gets its rule as message; pydantic's "Value error, "
    prefix is dropped.
    """
    items: dict[str, str] = {}
    for e in raw:
        loc = [str(p) for p in e.get("loc", ())]
        clean = [p for i, p in enumerate(loc) if i == 0 or not _UNION_TAG.search(p)]
        path = ".".join(clean)
        if path in items:
            continue
        rule = FIELD_RULES.get(clean[-1]) if clean else None
        message = rule or str(e.get("msg", "invalid")).removeprefix("Value error, ")
        items[path] = message
        if len(items) == 20:
            break
    return [{"path": p, "message": m} for p, m in items.items()]


async def _validation_error(request: Request, exc: Exception) -> Problem:
    assert isinstance(exc, RequestValidationError)
    items = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in items):
        return Problem(400, "malformed_json", "request body is not valid JSON")
    found = validation_items(items)
    first = f": {found[0]['path'].removeprefix('body.')} {found[0]['message']}" if found else ""
    return Problem(
        422,
        "invalid_request",
        f"request does not match the API schema{first}",
        extra={"errors": found},
    )


async def _http_error(request: Request, exc: Exception) -> Problem:
    assert isinstance(exc, StarletteHTTPException)
    # FastAPI turns any body-parsing failure other than a JSON syntax error into a generic
    # 400 "There was an error parsing the body", chaining the cause: name the two causes
    # a client can send like every other invalid payload.
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        return Problem(
            422,
            "invalid_input",
            f"request body is nested deeper than {MAX_DEPTH} levels",
            extra={"errors": [{"path": "$", "message": f"nesting over {MAX_DEPTH} levels"}]},
        )
    if isinstance(cause, UnicodeDecodeError):
        return Problem(400, "malformed_json", "request body is not valid UTF-8")
    code = {
        404: "not_found",
        405: "method_not_allowed",
        408: "request_timeout",
        413: "payload_too_large",
    }.get(exc.status_code, "http_error")
    return Problem(exc.status_code, code, str(exc.detail), getattr(exc, "headers", None))


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


async def _database_error(request: Request, exc: Exception) -> Problem:
    fault = classify(exc)
    if fault is None:
        return await _unexpected(request, exc)
    metrics.DB_FAULTS.labels(fault.value).inc()
    # The log (operators only) keeps the statement; the response never carries SQL.
    log.warning("database fault", fault=fault.value, path=request.url.path, error=str(exc)[:300])
    code, detail = _FAULT_PROBLEMS[fault]
    return Problem(503, code, detail, {"Retry-After": DB_FAULT_RETRY_AFTER})


async def _unexpected(request: Request, exc: Exception) -> Problem:
    if classify(exc) is not None:
        # A driver error SQLAlchemy did not wrap (asyncpg finding no read-write host of a
        # multi-host URL mid-failover): a database fault, 503, not a bug.
        return await _database_error(request, exc)
    log.exception("unhandled error", path=request.url.path)
    return Problem(500, "internal_error", "internal error; it has been logged")


_Build = Callable[[Request, Exception], Awaitable[Problem]]


def _handler(
    build: _Build, pages: ProblemPages
) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handle(request: Request, exc: Exception) -> Response:
        return await pages.respond(request, await build(request, exc))

    return handle


def install(app: FastAPI, pages: ProblemPages | None = None) -> None:
    """Register every exception handler on ``app``.

    Args:
        app: the application.
        pages: how problems are rendered per path prefix (default: problem+json for
            every path); the same object the request guards are given.
    """
    pages = pages or ProblemPages()
    handlers: list[tuple[type[Exception], _Build]] = [
        (errors.TreadleError, _treadle_error),
        (RequestValidationError, _validation_error),
        (StarletteHTTPException, _http_error),
        # DBAPIError covers OperationalError; errors that are no transient fault are a 500.
        (DBAPIError, _database_error),
        (PoolTimeout, _database_error),
        (ConnectionError, _database_error),
        (Exception, _unexpected),
    ]
    for exc_class, build in handlers:
        app.add_exception_handler(exc_class, _handler(build, pages))
