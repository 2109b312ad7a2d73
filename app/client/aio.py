"""``AsyncTreadleClient``: the asyncio first-party client of the Treadle API (httpx).

The same methods as :class:`app.client.TreadleClient`, as coroutines (``list_all`` and
``dead_letters_all`` are async iterators). Usage (docs/clients.md)::

    async with AsyncTreadleClient("http://127.0.0.1:8000", token) as treadle:
        result = await treadle.execute("orders", {"order_id": "1001", ...})
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import httpx

from app.client import _http
from app.client._http import Call, M, segment
from app.client.errors import RunFailed, RunNotFinished
from app.client.models import (
    ApprovalDecision,
    DeadLetter,
    DeadLetterPage,
    EventPage,
    Run,
    RunPage,
    RunReport,
    RunResult,
    SignalAccepted,
    StepPage,
    WorkflowList,
)

RunId = str | uuid.UUID


class AsyncTreadleClient:
    """Asyncio client of one Treadle API server.

    Every method sends one request (``execute``/``wait``/``list_all`` several), retries
    429/503 answers after their ``Retry-After`` up to ``max_retries`` times, and raises
    :class:`~app.client.errors.TreadleAPIError` (``code``, ``status``, ``title``,
    ``detail``) for any error answer, or its subclass
    :class:`~app.client.errors.TreadleUnreachable` when no answer came. Ids in paths are
    URL-quoted. Use it as a context manager, or call :meth:`close`.

    Args:
        base_url: the API's base URL, e.g. ``http://127.0.0.1:8000``.
        token: bearer token (a JWT or an API key ``trd_…``); None for the probes only.
        timeout: seconds for one request (long-polls add their ``wait``).
        max_retries: retries of a 429/503 answer (0 disables them).
        max_retry_wait: ceiling in seconds on one wait between retries.
        http_client: an ``httpx.AsyncClient`` to use instead of the client's own (its
            ``base_url`` and headers are then the caller's business; not closed here).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = _http.DEFAULT_MAX_RETRIES,
        max_retry_wait: float = _http.DEFAULT_MAX_RETRY_WAIT,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(
            base_url=self.base_url, headers=_http.client_headers(token), timeout=timeout
        )

    @classmethod
    def from_env(cls, **kwargs: Any) -> Self:
        """A client for ``TREADLE_URL`` (default: localhost port 8000) and ``TREADLE_TOKEN``."""
        return cls(
            os.environ.get("TREADLE_URL", "http://127.0.0.1:8000"),
            os.environ.get("TREADLE_TOKEN"),
            **kwargs,
        )

    async def __aenter__(self) -> Self:
        """Return self; the connection pool closes on exit."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the connection pool."""
        await self.close()

    async def close(self) -> None:
        """Close the connection pool (unless ``http_client`` was given)."""
        if self._owns_http:
            await self._http.aclose()

    # --- sending ----------------------------------------------------------------------

    async def send(self, call: Call) -> httpx.Response:
        """Send ``call``, retrying 429/503 answers; return the final response undecoded.

        Raises:
            TreadleUnreachable: no answer (connection refused, DNS, timeout, reset).
        """
        attempt = 0
        while True:
            try:
                resp = await self._http.request(call.method, call.path, **call.kwargs())
            except httpx.TransportError as exc:
                raise _http.unreachable(self.base_url, exc) from exc
            if not _http.should_retry(resp, attempt, self.max_retries):
                return resp
            await asyncio.sleep(_http.retry_delay(resp, attempt, self.max_retry_wait))
            attempt += 1

    async def _model(self, call: Call, model: type[M]) -> M:
        return _http.decode(await self.send(call), model)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
    ) -> Any:
        """Any other operation: send and return the decoded JSON (None for 204).

        ``path`` is used as given: quote ids with :func:`app.client.quote_segment`.

        Raises:
            TreadleAPIError: an error answer, or one that is not JSON.
        """
        call = Call(method.upper(), path, params=_http.query(**(params or {})))
        if json is not None:
            call = Call(call.method, path, params=call.params, body=json)
        return _http.decode_json(await self.send(call))

    # --- runs ---------------------------------------------------------------------------

    async def submit(
        self,
        workflow: str,
        input: Any = None,
        *,
        version: str | int | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
    ) -> Run:
        """Submit a run (``POST /runs``); an identical retry with the same key returns it.

        Args:
            workflow: registered workflow name.
            input: JSON input, validated by the server against the workflow's schema.
            version: pin a registered version (default: the newest).
            idempotency_key: makes retries safe: the same key and request give the same run.
            concurrency_key: at most ``key_limit`` active runs per key.
            priority: claim priority -100..100.
            delay: seconds before the run may start.

        Raises:
            TreadleAPIError: 404 ``workflow_not_found``, 422 invalid input, 409 key reused
                differently or concurrency key busy, 413 payload too large, …
        """
        call = _http.submit_call(
            workflow,
            input,
            version=version,
            idempotency_key=idempotency_key,
            concurrency_key=concurrency_key,
            priority=priority,
            delay=delay,
        )
        return await self._model(call, Run)

    async def get(self, run_id: RunId) -> Run:
        """The run's snapshot (``GET /runs/{run_id}``); 404 ``run_not_found`` if not visible."""
        return await self._model(Call("GET", f"/runs/{segment(run_id)}"), Run)

    async def result(self, run_id: RunId, *, wait: float = 0) -> RunResult:
        """The run's result, long-polling up to ``wait`` seconds (≤ 300) for it to finish.

        ``done`` is False if the run is still open when ``wait`` ends.
        """
        return await self._model(_http.result_call(run_id, wait, self.timeout), RunResult)

    async def wait(
        self, run_id: RunId, *, timeout: float | None = None, check: bool = True
    ) -> RunResult:
        """Wait until the run is terminal (long-polls of at most 60 s each).

        Args:
            run_id: the run.
            timeout: give up after this many seconds (None: wait as long as it takes).
            check: raise :class:`RunFailed` unless the run ended ``completed``.

        Raises:
            RunFailed: ``check`` and the run ended failed, cancelled or compensated.
            RunNotFinished: still open after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _http.LONG_POLL_SECONDS
            if deadline is not None:
                left = min(left, max(deadline - time.monotonic(), 0.0))
            res = await self.result(run_id, wait=left)
            if res.done:
                if check and not res.succeeded:
                    raise RunFailed(res)
                return res
            if deadline is not None and time.monotonic() >= deadline:
                raise RunNotFinished(res, timeout or 0.0)

    async def execute(
        self,
        workflow: str,
        input: Any = None,
        *,
        version: str | int | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> RunResult:
        """Submit a run and wait until it is terminal: :meth:`submit` then :meth:`wait`.

        Returns:
            The terminal result; with ``check=False`` also a failed one (``succeeded``
            is False, ``reason`` and ``error`` say why).

        Raises:
            TreadleAPIError: the submission was refused.
            RunFailed: ``check`` and the run did not complete (``.result`` has it).
            RunNotFinished: still open after ``timeout`` seconds.
        """
        run = await self.submit(
            workflow,
            input,
            version=version,
            idempotency_key=idempotency_key,
            concurrency_key=concurrency_key,
            priority=priority,
        )
        return await self.wait(run.run_id, timeout=timeout, check=check)

    async def list(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_token: str | None = None,
        limit: int = 50,
    ) -> RunPage:
        """One page of the tenant's runs, newest first (``limit`` 1..200).

        Pass ``next_page_token`` back as ``page_token`` with the same filters for the
        next page; it is None on the last.
        """
        call = _http.list_call(
            workflow=workflow,
            status=status,
            created_after=created_after,
            created_before=created_before,
            page_token=page_token,
            limit=limit,
        )
        return await self._model(call, RunPage)

    async def list_all(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_size: int = 200,
    ) -> AsyncIterator[Run]:
        """Every run matching the filters, newest first, fetching pages as it goes."""
        token: str | None = None
        while True:
            page = await self.list(
                workflow=workflow,
                status=status,
                created_after=created_after,
                created_before=created_before,
                page_token=token,
                limit=page_size,
            )
            for item in page.items:
                yield item
            token = page.next_page_token
            if token is None:
                return

    async def steps(
        self, run_id: RunId, *, page_token: str | None = None, limit: int = 100
    ) -> StepPage:
        """One page of the run's steps in call order."""
        params = _http.query(page_token=page_token, limit=limit)
        return await self._model(
            Call("GET", f"/runs/{segment(run_id)}/steps", params=params), StepPage
        )

    async def events(
        self, run_id: RunId, *, page_token: str | None = None, limit: int = 200
    ) -> EventPage:
        """One page of the run's timeline, oldest first."""
        params = _http.query(page_token=page_token, limit=limit)
        return await self._model(
            Call("GET", f"/runs/{segment(run_id)}/events", params=params), EventPage
        )

    async def report(self, run_id: RunId) -> RunReport:
        """The operator's report as JSON: run, steps, timeline, dead letters."""
        return await self._model(_http.report_call(run_id, text=False), RunReport)

    async def report_text(self, run_id: RunId) -> str:
        """The operator's report as four readable text sections (what curl gets)."""
        return _http.decode_text(await self.send(_http.report_call(run_id, text=True)))

    async def cancel(self, run_id: RunId, *, reason: str | None = None) -> Run:
        """Cancel a run; idempotent for a cancelled run, 409 ``invalid_state`` once finished."""
        body = {"reason": reason} if reason else None
        return await self._model(Call("POST", f"/runs/{segment(run_id)}/cancel", body=body), Run)

    async def signal(self, run_id: RunId, name: str, payload: Any = None) -> SignalAccepted:
        """Send signal ``name`` (buffered until the run waits for it; 409 once finished)."""
        call = Call(
            "POST", f"/runs/{segment(run_id)}/signals/{segment(name)}", body={"payload": payload}
        )
        return await self._model(call, SignalAccepted)

    async def approve(
        self, run_id: RunId, step_id: str, *, payload: Any = None, comment: str | None = None
    ) -> ApprovalDecision:
        """Approve the run's waiting approval ``step_id`` as the token's subject."""
        call = _http.decision_call(run_id, step_id, "approve", payload, comment)
        return await self._model(call, ApprovalDecision)

    async def reject(
        self, run_id: RunId, step_id: str, *, payload: Any = None, comment: str | None = None
    ) -> ApprovalDecision:
        """Reject the run's waiting approval ``step_id`` as the token's subject."""
        call = _http.decision_call(run_id, step_id, "reject", payload, comment)
        return await self._model(call, ApprovalDecision)

    async def resume(self, run_id: RunId) -> Run:
        """Make a waiting or retrying run due now (409 if it is not waiting)."""
        return await self._model(Call("POST", f"/runs/{segment(run_id)}/resume"), Run)

    async def retry(
        self, run_id: RunId, *, reason: str, correlation_id: str | None = None
    ) -> DeadLetter:
        """Re-run a failed run from its failed point (requeues its pending dead letter)."""
        body = {"reason": reason, "correlation_id": correlation_id}
        return await self._model(
            Call("POST", f"/runs/{segment(run_id)}/retry", body=body), DeadLetter
        )

    # --- dead letters and workflows -----------------------------------------------------

    async def dead_letters(
        self,
        *,
        status: str = "pending",
        workflow: str | None = None,
        page_token: str | None = None,
        limit: int = 50,
    ) -> DeadLetterPage:
        """One page of dead letters, newest first (``status`` ``pending`` or ``all``)."""
        call = _http.dead_letters_call(
            status=status, workflow=workflow, page_token=page_token, limit=limit
        )
        return await self._model(call, DeadLetterPage)

    async def dead_letters_all(
        self, *, status: str = "pending", workflow: str | None = None, page_size: int = 200
    ) -> AsyncIterator[DeadLetter]:
        """Every dead letter matching the filters, newest first, page by page."""
        token: str | None = None
        while True:
            page = await self.dead_letters(
                status=status, workflow=workflow, page_token=token, limit=page_size
            )
            for item in page.items:
                yield item
            token = page.next_page_token
            if token is None:
                return

    async def requeue(
        self, dead_letter_id: str | uuid.UUID, *, reason: str, correlation_id: str | None = None
    ) -> DeadLetter:
        """Requeue a dead letter: its run re-runs from the failed point (409 if requeued)."""
        body = {"reason": reason, "correlation_id": correlation_id}
        call = Call("POST", f"/dead-letters/{segment(dead_letter_id)}/requeue", body=body)
        return await self._model(call, DeadLetter)

    async def workflows(self) -> WorkflowList:
        """Registered workflows, their versions and live workers."""
        return await self._model(Call("GET", "/workflows"), WorkflowList)
