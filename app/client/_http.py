"""What the sync and async clients share: request descriptions, retry waits, decoding.

Each API operation is described once as a :class:`Call` (method, quoted path, query,
body); :class:`app.client.TreadleClient` and :class:`app.client.AsyncTreadleClient` only
differ in how they send it and wait between retries.
"""

from __future__ import annotations

import email.utils
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from app.client.errors import InvalidBody, TreadleAPIError, TreadleUnreachable
from app.client.models import Batch, BulkDryRun
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
        # None sends no body, as httpx's ``json=None`` did (an optional body left out).
        if self.body is not _NO_BODY and self.body is not None:
            out["content"] = encode_body(self.body)
            out["headers"] = {**self.headers, "Content-Type": "application/json"}
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


def encode_body(body: Any) -> bytes:
    """``body`` as the API's JSON: ASCII-escaped, compact; pydantic models as their JSON form.

    Escaping keeps a lone surrogate sendable (the API answers it 422, as it would any
    client's) instead of failing inside httpx's UTF-8 encoder.

    Raises:
        InvalidBody: NaN/Infinity, a value that is not JSON, or nesting too deep.
    """
    try:
        text = json.dumps(
            to_jsonable_python(body), ensure_ascii=True, allow_nan=False, separators=(",", ":")
        )
        return text.encode("ascii")
    except RecursionError:
        raise InvalidBody("request body is nested too deep to encode; nothing was sent") from None
    except (TypeError, ValueError, PydanticSerializationError) as exc:
        raise InvalidBody(f"request body is not JSON ({exc}); nothing was sent") from None


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
    labels: Mapping[str, str] | None = None,
) -> Call:
    """``POST /runs``."""
    body: dict[str, Any] = {"workflow": workflow, "input": input}
    for name, value in (
        ("version", version),
        ("idempotency_key", idempotency_key),
        ("concurrency_key", concurrency_key),
        ("priority", priority),
        ("delay", delay),
        ("labels", dict(labels) if labels else None),
    ):
        if value is not None:
            body[name] = value
    return Call("POST", "/runs", body=body)


def submit_batch_call(runs: Sequence[Mapping[str, Any] | Any]) -> Call:
    """``POST /runs:batch``: each item a ``POST /runs`` body (``workflow``, ``input``, …).

    An item that is not a mapping is sent as it is: the API answers that item alone
    with ``422 invalid_request`` (docs/api.md), as it would any malformed item.
    """
    items = [dict(r) if isinstance(r, Mapping) else r for r in runs]
    return Call("POST", "/runs:batch", body={"runs": items})


def result_call(run_id: str | uuid.UUID, wait: float, timeout: float) -> Call:
    """``GET /runs/{run_id}/result?wait=S``; the request may take ``wait`` + ``timeout``."""
    wait = min(max(wait, 0.0), MAX_SERVER_WAIT)
    return Call(
        "GET",
        f"/runs/{segment(run_id)}/result",
        params=query(wait=wait),
        timeout=wait + timeout,
    )


def filter_params(
    filters: Mapping[str, Any] | None, labels: Mapping[str, str] | None
) -> dict[str, str | int | float]:
    """The newer ``GET /runs`` filters as query parameters.

    ``filters``: ``reason``, ``version``, ``finished_after``, ``finished_before``,
    ``waiting_on`` (None values left out). ``labels``: ``{key: value}`` sent as
    ``label.<key>=<value>``; a value ending in ``*`` is a prefix match.
    """
    out = query(**(filters or {}))
    for key, value in (labels or {}).items():
        out[f"label.{key}"] = value
    return out


def list_call(
    *,
    workflow: str | None,
    status: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    page_token: str | None,
    limit: int,
    idempotency_key: str | None = None,
    filters: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Call:
    """``GET /runs`` (``filters`` and ``labels`` as :func:`filter_params`)."""
    return Call(
        "GET",
        "/runs",
        params={
            **query(
                workflow=workflow,
                status=status,
                created_after=created_after,
                created_before=created_before,
                idempotency_key=idempotency_key,
                page_token=page_token,
                limit=limit,
            ),
            **filter_params(filters, labels),
        },
    )


def counts_call(
    *,
    workflow: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    idempotency_key: str | None,
    filters: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Call:
    """``GET /runs/counts`` (``filters`` and ``labels`` as :func:`filter_params`)."""
    return Call(
        "GET",
        "/runs/counts",
        params={
            **query(
                workflow=workflow,
                created_after=created_after,
                created_before=created_before,
                idempotency_key=idempotency_key,
            ),
            **filter_params(filters, labels),
        },
    )


def approvals_call(*, workflow: str | None, page_token: str | None, limit: int) -> Call:
    """``GET /approvals``."""
    return Call(
        "GET", "/approvals", params=query(workflow=workflow, page_token=page_token, limit=limit)
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


def _reason_body(reason: str | None) -> dict[str, str] | None:
    # No body at all for an empty or absent reason: both routes take the body as optional.
    return {"reason": reason} if reason else None


def cancel_call(run_id: str | uuid.UUID, reason: str | None) -> Call:
    """``POST /runs/{run_id}/cancel`` (``reason`` only when given)."""
    return Call("POST", f"/runs/{segment(run_id)}/cancel", body=_reason_body(reason))


def pause_call(run_id: str | uuid.UUID, reason: str | None) -> Call:
    """``POST /runs/{run_id}/pause`` (``reason`` only when given)."""
    return Call("POST", f"/runs/{segment(run_id)}/pause", body=_reason_body(reason))


def unpause_call(run_id: str | uuid.UUID) -> Call:
    """``POST /runs/{run_id}/unpause``."""
    return Call("POST", f"/runs/{segment(run_id)}/unpause")


def rerun_call(run_id: str | uuid.UUID, from_step: str, idempotency_key: str | None) -> Call:
    """``POST /runs/{run_id}/rerun`` from journaled step ``from_step``."""
    body = {"from_step": from_step, "idempotency_key": idempotency_key}
    return Call("POST", f"/runs/{segment(run_id)}/rerun", body=body)


def batch_call(batch_id: str | uuid.UUID) -> Call:
    """``GET /batches/{batch_id}``."""
    return Call("GET", f"/batches/{segment(batch_id)}")


def batches_call(*, page_token: str | None, limit: int) -> Call:
    """``GET /batches`` (an empty ``page_token`` is the first page, like None)."""
    params: dict[str, str | int | float] = {"limit": limit}
    if page_token:
        params["page_token"] = page_token
    return Call("GET", "/batches", params=params)


def cancel_batch_call(batch_id: str | uuid.UUID) -> Call:
    """``POST /batches/{batch_id}/cancel``."""
    return Call("POST", f"/batches/{segment(batch_id)}/cancel")


def create_webhook_call(url: str, *, events: Sequence[str] | None, workflow: str | None) -> Call:
    """``POST /webhooks``."""
    body: dict[str, Any] = {"url": url}
    if events is not None:
        body["events"] = list(events)
    if workflow is not None:
        body["workflow"] = workflow
    return Call("POST", "/webhooks", body=body)


def webhook_call(method: str, webhook_id: str | uuid.UUID) -> Call:
    """``GET`` or ``DELETE /webhooks/{webhook_id}``."""
    return Call(method, f"/webhooks/{segment(webhook_id)}")


def webhook_deliveries_call(
    webhook_id: str | uuid.UUID, *, page_token: str | None, limit: int
) -> Call:
    """``GET /webhooks/{webhook_id}/deliveries``."""
    params: dict[str, str | int | float] = {"limit": limit}
    if page_token:
        params["page_token"] = page_token
    return Call("GET", f"/webhooks/{segment(webhook_id)}/deliveries", params=params)


BULK_ACTIONS = ("cancel", "retry", "resume", "signal", "pause", "unpause")
"""The ``POST /runs:<action>`` bulk actions."""


def bulk_call(
    action: str,
    *,
    run_ids: Sequence[Any] | None,
    filter: Mapping[str, Any] | None,
    dry_run: bool,
    reason: str | None,
    name: str | None,
    payload: Any,
) -> Call:
    """The request of a bulk action (``name``/``payload`` only for ``signal``).

    Raises:
        ValueError: an unknown action (checked here so a typo never reaches the server).
    """
    if action not in BULK_ACTIONS:
        raise ValueError(f"unknown bulk action {action!r}: use one of {', '.join(BULK_ACTIONS)}")
    body: dict[str, Any] = {"dry_run": dry_run}
    if run_ids is not None:
        body["run_ids"] = [str(r) for r in run_ids]
    if filter is not None:
        body["filter"] = dict(filter)
    if reason is not None:
        body["reason"] = reason
    if action == "signal":
        body["name"] = name
        body["payload"] = payload
    return Call("POST", f"/runs:{action}", body=body)


def decode_bulk(resp: httpx.Response) -> Batch | BulkDryRun:
    """A bulk action's answer: 200 a :class:`BulkDryRun`, 202 a :class:`Batch`."""
    if resp.status_code == 200:
        return decode(resp, BulkDryRun)
    return decode(resp, Batch)
