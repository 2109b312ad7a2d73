"""What the sync and async clients share: request descriptions, retry waits, decoding.

Each API operation is described once as a :class:`Call` (method, quoted path, query,
body); :class:`app.client.TreadleClient` and :class:`app.client.AsyncTreadleClient` only
differ in how they send it and wait between retries.
"""

from __future__ import annotations

import email.utils
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from app.client.errors import TreadleAPIError, TreadleUnreachable
from app.core.version import treadle_version

M = TypeVar("M", bound=BaseModel)

RETRY_STATUSES = frozenset({429, 503})
"""Statuses the clients retry after ``Retry-After``: the server changed nothing (the
transaction rolled back, docs/operations.md#database-faults), so the same request may
be sent again, even a ``POST``."""

DEFAULT_MAX_RETRIES = 3
"""Retries of one request answered 429/503 before the error is raised."""

DEFAULT_MAX_RETRY_WAIT = 30.0
"""Ceiling in seconds on one wait between retries, whatever ``Retry-After`` says."""

LONG_POLL_SECONDS = 60.0
"""Longest ``wait`` of one ``GET /runs/{id}/result`` while ``execute`` waits (seconds):
short enough for proxies with idle timeouts, long enough to cost few requests. The
server allows up to 300."""

MAX_SERVER_WAIT = 300.0
"""The server's ceiling on ``?wait=`` (docs/api.md)."""

USER_AGENT = f"treadle-client/{treadle_version()}"


def segment(value: str | uuid.UUID) -> str:
    """Quote one path segment: ``/``, ``?``, ``#``, ``%`` and spaces cannot change the path."""
    return quote(str(value), safe="")


def query(**values: Any) -> dict[str, str | int | float]:
    """Query parameters without the ``None`` ones; datetimes as ISO 8601 (naive → UTC)."""
    out: dict[str, str | int | float] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, datetime):
            out[name] = (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
        elif isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, int | float | str):
            out[name] = value
        else:
            out[name] = str(value)
    return out


_NO_BODY: Any = object()


@dataclass(frozen=True)
class Call:
    """One HTTP request to the API, before it is sent.

    Attributes:
        method: HTTP method.
        path: path with every id already quoted (:func:`segment`).
        params: query parameters.
        body: JSON body, or absent.
        headers: extra headers (e.g. ``Accept``).
        timeout: seconds for this request, overriding the client's (long-polls).
    """

    method: str
    path: str
    params: dict[str, str | int | float] = field(default_factory=dict)
    body: Any = _NO_BODY
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``httpx.Client.request`` / ``AsyncClient.request``."""
        out: dict[str, Any] = {"params": self.params or None, "headers": self.headers or None}
        if self.body is not _NO_BODY:
            out["json"] = self.body
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


def client_headers(token: str | None) -> dict[str, str]:
    """Default headers: ``User-Agent`` and, with a token, ``Authorization: Bearer``."""
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def should_retry(resp: httpx.Response, attempt: int, max_retries: int) -> bool:
    """True if ``resp`` is a 429/503 and fewer than ``max_retries`` retries were made."""
    return resp.status_code in RETRY_STATUSES and attempt < max_retries


def retry_delay(resp: httpx.Response, attempt: int, max_wait: float) -> float:
    """Seconds to wait before retry ``attempt`` (0-based) of a 429/503 answer.

    ``Retry-After`` as delta-seconds or an HTTP-date (RFC 9110 §10.2.3) is honoured;
    without one, 0.5 s doubling per attempt. Always within ``[0, max_wait]``.
    """
    header = resp.headers.get("retry-after", "").strip()
    delay: float | None = None
    if header:
        try:
            delay = float(header)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(header)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                when = when if when.tzinfo else when.replace(tzinfo=UTC)
                delay = (when - datetime.now(UTC)).total_seconds()
    if delay is None or delay != delay:  # absent, unparsable or NaN
        delay = 0.5 * 2**attempt
    return min(max(delay, 0.0), max_wait)


def unreachable(base_url: str, exc: httpx.TransportError) -> TreadleUnreachable:
    """The error for a request that got no answer (connection, DNS, timeout, reset)."""
    reason = str(exc) or type(exc).__name__
    return TreadleUnreachable(f"cannot reach the Treadle API at {base_url}: {reason}")


def _snippet(resp: httpx.Response) -> str:
    text = " ".join(resp.text.split())
    return text[:200] + ("…" if len(text) > 200 else "")


def raise_for_problem(resp: httpx.Response) -> None:
    """Raise :class:`TreadleAPIError` for a 4xx/5xx answer; return for any other.

    A problem+json body gives ``code``/``title``/``detail``; any other error body (a
    proxy's HTML page, an empty 502) gives code ``unexpected_response`` and the start of
    the body as the detail.
    """
    if resp.status_code < 400:
        return
    body: Any = None
    if "json" in resp.headers.get("content-type", ""):
        try:
            body = resp.json()
        except ValueError:
            body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        raise TreadleAPIError(
            str(body.get("detail") or body.get("title") or resp.reason_phrase),
            code=body["code"],
            status=resp.status_code,
            title=str(body.get("title") or resp.reason_phrase),
            problem=body,
        )
    raise TreadleAPIError(
        f"{resp.request.method} {resp.request.url.path} answered {resp.status_code} "
        f"{resp.reason_phrase} with {resp.headers.get('content-type') or 'no content type'}: "
        f"{_snippet(resp) or '(empty body)'}",
        code="unexpected_response",
        status=resp.status_code,
        title=resp.reason_phrase,
    )


def decode_json(resp: httpx.Response) -> Any:
    """The JSON body of a success; raises :class:`TreadleAPIError` for anything else."""
    raise_for_problem(resp)
    if resp.status_code == 204 or not resp.content:
        return None
    if "json" not in resp.headers.get("content-type", ""):
        raise TreadleAPIError(
            f"expected JSON, got {resp.headers.get('content-type') or 'no content type'}: "
            f"{_snippet(resp)}",
            code="unexpected_response",
            status=resp.status_code,
            title=resp.reason_phrase,
        )
    try:
        return resp.json()
    except ValueError:
        raise TreadleAPIError(
            f"the answer is not valid JSON: {_snippet(resp)}",
            code="unexpected_response",
            status=resp.status_code,
            title=resp.reason_phrase,
        ) from None


def decode(resp: httpx.Response, model: type[M]) -> M:
    """Validate a success's JSON body as ``model``; raises :class:`TreadleAPIError`."""
    data = decode_json(resp)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise TreadleAPIError(
            f"the answer does not match {model.__name__}: {exc.errors()[:3]}",
            code="unexpected_response",
            status=resp.status_code,
            title=resp.reason_phrase,
        ) from None


def decode_text(resp: httpx.Response) -> str:
    """The ``text/plain`` body of a success; raises :class:`TreadleAPIError` otherwise."""
    raise_for_problem(resp)
    if not resp.headers.get("content-type", "").startswith("text/plain"):
        raise TreadleAPIError(
            f"expected text/plain, got {resp.headers.get('content-type')}",
            code="unexpected_response",
            status=resp.status_code,
            title=resp.reason_phrase,
        )
    return resp.text


# --- the operations, described once ----------------------------------------------------


def submit_call(
    workflow: str,
    input: Any,
    *,
    version: str | int | None,
    idempotency_key: str | None,
    concurrency_key: str | None,
    priority: int | None,
    delay: float | None,
) -> Call:
    """``POST /runs``."""
    body: dict[str, Any] = {"workflow": workflow, "input": input}
    for name, value in (
        ("version", version),
        ("idempotency_key", idempotency_key),
        ("concurrency_key", concurrency_key),
        ("priority", priority),
        ("delay", delay),
    ):
        if value is not None:
            body[name] = value
    return Call("POST", "/runs", body=body)


def result_call(run_id: str | uuid.UUID, wait: float, timeout: float) -> Call:
    """``GET /runs/{run_id}/result?wait=S``; the request may take ``wait`` + ``timeout``."""
    wait = min(max(wait, 0.0), MAX_SERVER_WAIT)
    return Call(
        "GET",
        f"/runs/{segment(run_id)}/result",
        params=query(wait=wait),
        timeout=wait + timeout,
    )


def list_call(
    *,
    workflow: str | None,
    status: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    page_token: str | None,
    limit: int,
) -> Call:
    """``GET /runs``."""
    return Call(
        "GET",
        "/runs",
        params=query(
            workflow=workflow,
            status=status,
            created_after=created_after,
            created_before=created_before,
            page_token=page_token,
            limit=limit,
        ),
    )


def dead_letters_call(
    *, status: str, workflow: str | None, page_token: str | None, limit: int
) -> Call:
    """``GET /dead-letters``."""
    return Call(
        "GET",
        "/dead-letters",
        params=query(status=status, workflow=workflow, page_token=page_token, limit=limit),
    )


def decision_call(
    run_id: str | uuid.UUID,
    step_id: str,
    decision: str,
    payload: Any,
    comment: str | None,
) -> Call:
    """``POST /runs/{run_id}/approvals/{step_id}``."""
    return Call(
        "POST",
        f"/runs/{segment(run_id)}/approvals/{segment(step_id)}",
        body={"decision": decision, "payload": payload, "comment": comment},
    )


def report_call(run_id: str | uuid.UUID, *, text: bool) -> Call:
    """``GET /runs/{run_id}/report`` (JSON, or ``?format=text`` with ``Accept: text/plain``)."""
    return Call(
        "GET",
        f"/runs/{segment(run_id)}/report",
        params=query(format="text" if text else "json"),
        headers={"Accept": "text/plain" if text else "application/json"},
    )
