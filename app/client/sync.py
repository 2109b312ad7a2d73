"""``TreadleClient``: the synchronous first-party client of the Treadle API (httpx).

Usage (docs/clients.md)::

    with TreadleClient("http://127.0.0.1:8000", token) as treadle:
        result = treadle.execute("orders", {"order_id": "1001", ...})
        print(result.output)
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import httpx

from app.client import _http, _sse
from app.client._http import Call, M, segment
from app.client.errors import RunFailed, RunNotFinished
from app.client.models import (
    ApprovalDecision,
    ApprovalPage,
    Batch,
    BatchPage,
    BulkDryRun,
    CreatedWebhook,
    DeadLetter,
    DeadLetterPage,
    Event,
    EventPage,
    InboundEvent,
    LogPage,
    Run,
    RunCounts,
    RunPage,
    RunReport,
    RunResult,
    SignalAccepted,
    StepPage,
    SubmittedBatch,
    Webhook,
    WebhookDeliveryPage,
    WebhookList,
    WhoAmI,
    WorkflowList,
)

RunId = str | uuid.UUID


class TreadleClient:
    """Synchronous client of one Treadle API server.

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
        http_client: an ``httpx.Client`` to use instead of the client's own (its
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
        http_client: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(
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

    def __enter__(self) -> Self:
        """Return self; the connection pool closes on exit."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the connection pool."""
        self.close()

    def close(self) -> None:
        """Close the connection pool (unless ``http_client`` was given)."""
        if self._owns_http:
            self._http.close()

    # --- sending ----------------------------------------------------------------------

    def send(self, call: Call) -> httpx.Response:
        """Send ``call``, retrying 429/503 answers; return the final response undecoded.

        Raises:
            TreadleUnreachable: no answer (connection refused, DNS, timeout, reset).
        """
        attempt = 0
        while True:
            try:
                resp = self._http.request(call.method, call.path, **call.kwargs())
            except httpx.TransportError as exc:
                raise _http.unreachable(self.base_url, exc) from exc
            if not _http.should_retry(resp, attempt, self.max_retries):
                return resp
            time.sleep(_http.retry_delay(resp, attempt, self.max_retry_wait))
            attempt += 1

    def _model(self, call: Call, model: type[M]) -> M:
        return _http.decode(self.send(call), model)

    def request(
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
        return _http.decode_json(self.send(call))

    # --- runs ---------------------------------------------------------------------------

    def submit(
        self,
        workflow: str,
        input: Any = None,
        *,
        version: str | int | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        labels: Mapping[str, str] | None = None,
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
            labels: ``{key: value}`` to find the run by (``list(labels=...)``); at most 16,
                rules in docs/api.md (Labels).

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
            labels=labels,
        )
        return self._model(call, Run)

    def submit_batch(self, runs: Sequence[Mapping[str, Any] | Any]) -> SubmittedBatch:
        """Submit many runs in one request and transaction (``POST /runs:batch``).

        Args:
            runs: 1..1,000 ``POST /runs`` bodies (``{"workflow": …, "input": …,
                "idempotency_key": …}``, the same fields as :meth:`submit`); an item that
                is not a mapping is sent as it is and answered 422 on its own.

        Returns:
            Per-item results in request order; failed items (``status`` ≥ 400) carry their
            problem and do not stop the others (docs/api.md, "POST /runs:batch").

        Raises:
            TreadleAPIError: the request as a whole was refused (422 empty or over the
                limit, 413 body too large, 401/403).
        """
        return self._model(_http.submit_batch_call(runs), SubmittedBatch)

    def get(self, run_id: RunId) -> Run:
        """The run's snapshot (``GET /runs/{run_id}``); 404 ``run_not_found`` if not visible."""
        return self._model(Call("GET", f"/runs/{segment(run_id)}"), Run)

    def result(self, run_id: RunId, *, wait: float = 0) -> RunResult:
        """The run's result, long-polling up to ``wait`` seconds (≤ 300) for it to finish.

        ``done`` is False if the run is still open when ``wait`` ends.
        """
        return self._model(_http.result_call(run_id, wait, self.timeout), RunResult)

    def wait(self, run_id: RunId, *, timeout: float | None = None, check: bool = True) -> RunResult:
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
            res = self.result(run_id, wait=left)
            if res.done:
                if check and not res.succeeded:
                    raise RunFailed(res)
                return res
            if deadline is not None and time.monotonic() >= deadline:
                raise RunNotFinished(res, timeout or 0.0)

    def execute(
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
        run = self.submit(
            workflow,
            input,
            version=version,
            idempotency_key=idempotency_key,
            concurrency_key=concurrency_key,
            priority=priority,
        )
        return self.wait(run.run_id, timeout=timeout, check=check)

    def list(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        idempotency_key: str | None = None,
        page_token: str | None = None,
        limit: int = 50,
        reason: str | None = None,
        version: str | None = None,
        finished_after: datetime | None = None,
        finished_before: datetime | None = None,
        waiting_on: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> RunPage:
        """One page of the tenant's runs, newest first (``limit`` 1..200).

        ``idempotency_key`` finds the run submitted with that key (at most one).
        ``labels`` matches every ``{key: value}`` (a value ending in ``*`` is a prefix);
        ``waiting_on`` is ``"<kind>"`` or ``"<kind>:<name>"`` (e.g. ``"signal:payment"``);
        ``finished_*`` bound ``finished_at`` as ``[after, before)``. Pass
        ``next_page_token`` back as ``page_token`` with the same filters for the next
        page; it is None on the last.
        """
        call = _http.list_call(
            workflow=workflow,
            status=status,
            created_after=created_after,
            created_before=created_before,
            page_token=page_token,
            limit=limit,
            idempotency_key=idempotency_key,
            filters={
                "reason": reason,
                "version": version,
                "finished_after": finished_after,
                "finished_before": finished_before,
                "waiting_on": waiting_on,
            },
            labels=labels,
        )
        return self._model(call, RunPage)

    def run_counts(
        self,
        *,
        workflow: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        idempotency_key: str | None = None,
        reason: str | None = None,
        version: str | None = None,
        finished_after: datetime | None = None,
        finished_before: datetime | None = None,
        waiting_on: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> RunCounts:
        """Runs per status among those matching the filters (as :meth:`list`, not status)."""
        call = _http.counts_call(
            workflow=workflow,
            created_after=created_after,
            created_before=created_before,
            idempotency_key=idempotency_key,
            filters={
                "reason": reason,
                "version": version,
                "finished_after": finished_after,
                "finished_before": finished_before,
                "waiting_on": waiting_on,
            },
            labels=labels,
        )
        return self._model(call, RunCounts)

    def list_all(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_size: int = 200,
    ) -> Iterator[Run]:
        """Every run matching the filters, newest first, fetching pages as it goes."""
        token: str | None = None
        while True:
            page = self.list(
                workflow=workflow,
                status=status,
                created_after=created_after,
                created_before=created_before,
                page_token=token,
                limit=page_size,
            )
            yield from page.items
            token = page.next_page_token
            if token is None:
                return

    def steps(self, run_id: RunId, *, page_token: str | None = None, limit: int = 100) -> StepPage:
        """One page of the run's steps in call order."""
        params = _http.query(page_token=page_token, limit=limit)
        return self._model(Call("GET", f"/runs/{segment(run_id)}/steps", params=params), StepPage)

    def events(
        self, run_id: RunId, *, page_token: str | None = None, limit: int = 200
    ) -> EventPage:
        """One page of the run's timeline, oldest first."""
        params = _http.query(page_token=page_token, limit=limit)
        return self._model(Call("GET", f"/runs/{segment(run_id)}/events", params=params), EventPage)

    def follow_events(
        self, run_id: RunId, *, after: int | None = None, max_reconnects: int = 10
    ) -> Iterator[Event]:
        """Yield the run's events live (``GET /runs/{run_id}/events?follow=true``).

        Starts after event id ``after`` (default: the first event) and ends once the run
        is terminal and every event was yielded. A stream the server ends because the
        token is no longer accepted raises (see ``Raises``), it is not resumed. A
        dropped connection, a read timeout (no heartbeat within ``timeout`` seconds) or a
        server shutting down is resumed with ``Last-Event-ID``, so each event is yielded
        once, in order; 429/503 answers are retried after their ``Retry-After``.

        Args:
            run_id: the run.
            after: resume after this event id.
            max_reconnects: reconnects in a row without receiving an event before
                giving up.

        Raises:
            TreadleAPIError: an error answer (404 unknown run, 400 bad ``after``), or the
                server ended the stream because the token lapsed: code
                ``credential_expired`` or ``credential_revoked`` (status 401),
                ``tenant_suspended`` (403).
            TreadleUnreachable: no answer after ``max_reconnects`` reconnects.
        """
        cursor, failures, retries = after, 0, 0
        path = _sse.follow_path(run_id)
        while True:
            try:
                with self._http.stream(
                    "GET", path, params={"follow": "true"}, headers=_sse.follow_headers(cursor)
                ) as resp:
                    if resp.status_code != 200:
                        resp.read()
                        if _http.should_retry(resp, retries, self.max_retries):
                            time.sleep(_http.retry_delay(resp, retries, self.max_retry_wait))
                            retries += 1
                            continue
                        _http.raise_for_problem(resp)
                    parser = _sse.Parser()
                    for line in resp.iter_lines():
                        msg = parser.feed(line)
                        if msg is None:
                            continue
                        if msg.event == _sse.END:
                            error = _sse.end_error(msg.data)
                            if error is not None:
                                raise error
                            return
                        if msg.id is not None:
                            event = Event.model_validate_json(msg.data)
                            cursor, failures = event.event_id, 0
                            yield event
            except httpx.TransportError as exc:
                if failures >= max_reconnects:
                    raise _http.unreachable(self.base_url, exc) from exc
            # Closed without its end message: resume after the last event received.
            failures += 1
            if failures > max_reconnects:
                raise _http.unreachable(
                    self.base_url, httpx.ReadError("event stream closed without its end")
                )
            time.sleep(_sse.reconnect_wait(failures))

    def logs(
        self,
        run_id: RunId,
        *,
        level: str | None = None,
        step: str | None = None,
        page_token: str | None = None,
        limit: int = 200,
    ) -> LogPage:
        """One page of the run's ``ctx.logger`` lines, oldest first.

        Args:
            run_id: the run.
            level: only lines of this severity or higher (debug, info, warning, error).
            step: only the lines of this step's attempts.
            page_token: ``next_page_token`` of the previous page.
            limit: lines per page, 1..500.
        """
        params = _http.query(level=level, step=step, page_token=page_token, limit=limit)
        return self._model(Call("GET", f"/runs/{segment(run_id)}/logs", params=params), LogPage)

    def report(self, run_id: RunId) -> RunReport:
        """The operator's report as JSON: run, steps, timeline, last log lines, dead letters."""
        return self._model(_http.report_call(run_id, text=False), RunReport)

    def report_text(self, run_id: RunId) -> str:
        """The operator's report as five readable text sections (what curl gets)."""
        return _http.decode_text(self.send(_http.report_call(run_id, text=True)))

    def cancel(self, run_id: RunId, *, reason: str | None = None) -> Run:
        """Cancel a run; idempotent for a cancelled run, 409 ``invalid_state`` once finished."""
        return self._model(_http.cancel_call(run_id, reason), Run)

    def post_event(self, name: str, data: Any = None, key: str | None = None) -> InboundEvent:
        """Post event ``name`` (``POST /events``, scope ``events:write``).

        Starts every workflow declaring ``on_event=name`` whose filter holds and resumes
        the tenant's runs waiting for it (``started_run_ids`` / ``resumed_run_ids``).
        With ``key``, a retry of the same event returns the first post's event and starts
        nothing more; another event under the same key is a 409 ``TreadleAPIError``.
        """
        body: dict[str, Any] = {"name": name, "data": {} if data is None else data}
        if key is not None:
            body["key"] = key
        return self._model(Call("POST", "/events", body=body), InboundEvent)

    def get_event(self, event_id: str | uuid.UUID) -> InboundEvent:
        """One posted event with the runs it started and resumed (404 if not the tenant's)."""
        return self._model(Call("GET", f"/events/{segment(event_id)}"), InboundEvent)

    def signal(self, run_id: RunId, name: str, payload: Any = None) -> SignalAccepted:
        """Send signal ``name`` (buffered until the run waits for it; 409 once finished)."""
        call = Call(
            "POST", f"/runs/{segment(run_id)}/signals/{segment(name)}", body={"payload": payload}
        )
        return self._model(call, SignalAccepted)

    def approve(
        self, run_id: RunId, step_id: str, *, payload: Any = None, comment: str | None = None
    ) -> ApprovalDecision:
        """Approve the run's waiting approval ``step_id`` as the token's subject."""
        call = _http.decision_call(run_id, step_id, "approve", payload, comment)
        return self._model(call, ApprovalDecision)

    def reject(
        self, run_id: RunId, step_id: str, *, payload: Any = None, comment: str | None = None
    ) -> ApprovalDecision:
        """Reject the run's waiting approval ``step_id`` as the token's subject."""
        call = _http.decision_call(run_id, step_id, "reject", payload, comment)
        return self._model(call, ApprovalDecision)

    def resume(self, run_id: RunId) -> Run:
        """Make a waiting or retrying run due now (409 if it is not waiting)."""
        return self._model(Call("POST", f"/runs/{segment(run_id)}/resume"), Run)

    def pause(self, run_id: RunId, *, reason: str | None = None) -> Run:
        """Pause a run: no new step until unpaused (409 ``run_finished`` once finished)."""
        return self._model(_http.pause_call(run_id, reason), Run)

    def unpause(self, run_id: RunId) -> Run:
        """Unpause a paused run (409 ``invalid_state`` if it is not paused)."""
        return self._model(_http.unpause_call(run_id), Run)

    def rerun(self, run_id: RunId, from_step: str, *, idempotency_key: str | None = None) -> Run:
        """Start a rerun of a finished run from journaled step ``from_step`` (the new run).

        422 ``invalid_input`` if ``from_step`` is not a journaled step of the run; 409 if
        the run is still open, its version is gone or the prefix cannot replay.
        """
        return self._model(_http.rerun_call(run_id, from_step, idempotency_key), Run)

    def retry(self, run_id: RunId, *, reason: str, correlation_id: str | None = None) -> DeadLetter:
        """Re-run a failed run from its failed point (requeues its pending dead letter)."""
        body = {"reason": reason, "correlation_id": correlation_id}
        return self._model(Call("POST", f"/runs/{segment(run_id)}/retry", body=body), DeadLetter)

    # --- dead letters and workflows -----------------------------------------------------

    def bulk(
        self,
        action: str,
        *,
        run_ids: Sequence[RunId] | None = None,
        filter: Mapping[str, Any] | None = None,
        dry_run: bool = False,
        reason: str | None = None,
        name: str | None = None,
        payload: Any = None,
    ) -> Batch | BulkDryRun:
        """Start a bulk action (``POST /runs:<action>``) on ``run_ids`` or a ``filter``.

        Args:
            action: cancel, retry, resume, signal, pause or unpause.
            run_ids: at most 1000 run ids (or give ``filter``).
            filter: the ``GET /runs`` filters as an object, labels as ``{"labels": {k: v}}``.
            dry_run: only count and sample; creates nothing.
            reason: recorded with each run's action.
            name: the signal's name (``signal`` only).
            payload: the signal's payload (``signal`` only).

        Returns:
            The running :class:`Batch` (poll :meth:`batch`), or a :class:`BulkDryRun`.

        Raises:
            ValueError: an unknown action.
            TreadleAPIError: 422 for both or neither of ids and filter, or too many runs.
        """
        call = _http.bulk_call(
            action,
            run_ids=run_ids,
            filter=filter,
            dry_run=dry_run,
            reason=reason,
            name=name,
            payload=payload,
        )
        return _http.decode_bulk(self.send(call))

    def batch(self, batch_id: str | uuid.UUID) -> Batch:
        """A batch and its progress (404 ``batch_not_found`` for another tenant's)."""
        return self._model(_http.batch_call(batch_id), Batch)

    def batches(self, *, page_token: str | None = None, limit: int = 50) -> BatchPage:
        """One page of the tenant's batches, newest first."""
        call = _http.batches_call(page_token=page_token, limit=limit)
        return self._model(call, BatchPage)

    def cancel_batch(self, batch_id: str | uuid.UUID) -> Batch:
        """Stop a running batch (idempotent; 409 ``invalid_state`` once completed)."""
        return self._model(_http.cancel_batch_call(batch_id), Batch)

    def create_webhook(
        self, url: str, *, events: Sequence[str] | None = None, workflow: str | None = None
    ) -> CreatedWebhook:
        """Register a webhook endpoint; the answer's ``secret`` is shown this once.

        Raises:
            TreadleAPIError: 422 ``webhook_target_refused`` (not http(s), malformed, or
                resolving to a private address), or unknown ``events``.
        """
        call = _http.create_webhook_call(url, events=events, workflow=workflow)
        return self._model(call, CreatedWebhook)

    def webhooks(self) -> WebhookList:
        """The tenant's webhook endpoints (without secrets)."""
        return self._model(_http.Call("GET", "/webhooks"), WebhookList)

    def webhook(self, webhook_id: str | uuid.UUID) -> Webhook:
        """One endpoint (404 ``webhook_not_found`` for another tenant's)."""
        return self._model(_http.webhook_call("GET", webhook_id), Webhook)

    def delete_webhook(self, webhook_id: str | uuid.UUID) -> None:
        """Delete an endpoint with its delivery log (pending deliveries are not sent)."""
        self.send(_http.webhook_call("DELETE", webhook_id))

    def webhook_deliveries(
        self, webhook_id: str | uuid.UUID, *, page_token: str | None = None, limit: int = 50
    ) -> WebhookDeliveryPage:
        """One page of an endpoint's delivery log, newest first, with every attempt."""
        call = _http.webhook_deliveries_call(webhook_id, page_token=page_token, limit=limit)
        return self._model(call, WebhookDeliveryPage)

    def dead_letters(
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
        return self._model(call, DeadLetterPage)

    def dead_letters_all(
        self, *, status: str = "pending", workflow: str | None = None, page_size: int = 200
    ) -> Iterator[DeadLetter]:
        """Every dead letter matching the filters, newest first, page by page."""
        token: str | None = None
        while True:
            page = self.dead_letters(
                status=status, workflow=workflow, page_token=token, limit=page_size
            )
            yield from page.items
            token = page.next_page_token
            if token is None:
                return

    def requeue(
        self, dead_letter_id: str | uuid.UUID, *, reason: str, correlation_id: str | None = None
    ) -> DeadLetter:
        """Requeue a dead letter: its run re-runs from the failed point (409 if requeued)."""
        body = {"reason": reason, "correlation_id": correlation_id}
        call = Call("POST", f"/dead-letters/{segment(dead_letter_id)}/requeue", body=body)
        return self._model(call, DeadLetter)

    def whoami(self) -> WhoAmI:
        """Who the token authenticates as: tenant, subject, scopes, groups (any valid token)."""
        return self._model(Call("GET", "/whoami"), WhoAmI)

    def approvals(
        self, *, workflow: str | None = None, page_token: str | None = None, limit: int = 50
    ) -> ApprovalPage:
        """One page of the waiting approvals the token's subject may decide, oldest first.

        Only approvals of the tenant's runs the caller may read, whose group is one of
        the caller's groups (or that name none), and that the caller has not decided yet.
        """
        call = _http.approvals_call(workflow=workflow, page_token=page_token, limit=limit)
        return self._model(call, ApprovalPage)

    def workflows(self) -> WorkflowList:
        """Registered workflows, their versions and live workers."""
        return self._model(Call("GET", "/workflows"), WorkflowList)
