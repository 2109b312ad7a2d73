"""OpenTelemetry traces: the one module that talks to the OpenTelemetry SDK.

Traces are an optional extra (``treadle[otel]``) and off unless configured
(docs/operations.md#traces, docs/adr/0026-traces-as-an-optional-extra.md). Engine, worker
and API code call the small functions here; each starts with the module-level check
``if not ENABLED``, so with tracing off no span is ever created and nothing of the SDK
is imported (the ``opentelemetry`` imports live inside the functions that run only once
:func:`setup` turned tracing on).

What a run's trace is made of:

- ``POST /runs``: a SERVER span, child of the client's W3C ``traceparent`` when it sent
  one (:func:`request_span`). Its own context is stored with the run (``runs.trace_parent``
  / ``trace_state``, :func:`submit_context`): that is how the trace crosses the queue.
- one span per execution (each claim of the run by a worker, :func:`execution_span`),
  child of the stored context, so every execution of a run, on any worker and after any
  crash, is in the one trace of its submission;
- one span per step attempt (:func:`step_call`), beside its execution span (same
  parent), linked to it;
- waits (timer, signal, approval, child, retry backoff, pause) that release the run are
  events on the execution span (:func:`wait_event`); errors are recorded on the span they
  happened in (``record_exception``, status ERROR).

Configuration is the SDK's own: the standard ``OTEL_*`` variables (exporter endpoint,
headers, protocol, sampler, batch processor timing, resource attributes, service name).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Awaitable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

T = TypeVar("T")

log = structlog.get_logger("treadle.tracing")

ENABLED = False
"""Whether this process traces: the one check every function here starts with."""

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_owns_provider = False

_TRACEPARENT = re.compile(
    r"^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$"
)
# W3C Trace Context §3.3: at most 32 list members; 512 characters is the length a
# vendor must be able to propagate, the column's size.
_TRACESTATE_MAX = 512
_SCOPE = "treadle"


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A W3C trace context as stored with a run (``runs.trace_parent`` / ``trace_state``).

    Attributes:
        traceparent: the ``traceparent`` header value (``00-<trace id>-<span id>-<flags>``).
        tracestate: the ``tracestate`` header value, or None.
    """

    traceparent: str
    tracestate: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> TraceContext | None:
        """The context a request carries, or None when its ``traceparent`` is absent or invalid.

        A ``tracestate`` over 512 characters is dropped (W3C Trace Context §3.3.1.5 lets
        a vendor truncate it; the parent is what links the trace).
        """
        parent = (headers.get("traceparent") or "").strip()
        if not _TRACEPARENT.match(parent):
            return None
        state = (headers.get("tracestate") or "").strip() or None
        if state is not None and (len(state) > _TRACESTATE_MAX or not state.isprintable()):
            state = None
        return cls(parent, state)

    @classmethod
    def of_run(cls, run: Mapping[Any, Any]) -> TraceContext | None:
        """The context stored with a ``runs`` row, or None."""
        parent = run.get("trace_parent")
        if not parent:
            return None
        return cls(str(parent), run.get("trace_state"))

    def headers(self) -> dict[str, str]:
        """As W3C headers (``traceparent``, and ``tracestate`` when set)."""
        out = {"traceparent": self.traceparent}
        if self.tracestate:
            out["tracestate"] = self.tracestate
        return out


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces.

    Off when ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``; on when
    ``OTEL_TRACES_EXPORTER`` names an exporter or an OTLP endpoint is set
    (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); off
    otherwise. The SDK itself would default to exporting to ``localhost:4318``; Treadle
    asks for an explicit choice so an unconfigured process never sends anything.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


_root_trace_id: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "treadle_root_trace_id", default=None
)


def _id_generator() -> Any:
    # The SDK's random ids, except the trace id of a context-less run's execution span:
    # its run id, so that all its executions share one trace (see execution_span).
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunTraceIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            forced = _root_trace_id.get()
            return forced if forced is not None else super().generate_trace_id()

        def is_trace_id_random(self) -> bool:
            # W3C Trace Context level 2's "random" flag: a UUIDv7 starts with its time,
            # and the randomness of the rest is uuid-utils' to vouch for, not ours.
            return _root_trace_id.get() is None

    return RunTraceIds()


def setup(service_name: str, *, processor: SpanProcessor | None = None) -> bool:
    """Turn tracing on for this process when configured; returns whether it is on.

    Called once by each composition root (``treadle serve``: ``treadle-api``, ``treadle
    worker``: ``treadle-worker``, ``treadle dev``: ``treadle``). ``service_name`` is the
    default ``service.name``: ``OTEL_SERVICE_NAME`` or a ``service.name`` in
    ``OTEL_RESOURCE_ATTRIBUTES`` wins. The exporters are those of
    ``OTEL_TRACES_EXPORTER`` (default ``otlp``, over ``OTEL_EXPORTER_OTLP_PROTOCOL``,
    default ``http/protobuf``), each behind a ``BatchSpanProcessor`` (its
    ``OTEL_BSP_*`` timing), shut down and flushed at interpreter exit. A process that
    already installed an SDK ``TracerProvider`` (``opentelemetry-instrument``) keeps it.

    Args:
        service_name: the default ``service.name``.
        processor: in-process use (tests, embedding): trace into this processor instead
            of the configured exporters, whatever the environment says, on a provider of
            our own that is not made the global one.

    Returns:
        True when tracing is on.

    Raises:
        ValueError: ``OTEL_TRACES_EXPORTER`` or the OTLP protocol names an exporter that
            is unknown or not installed.
    """
    global ENABLED, _tracer, _provider, _owns_provider
    if processor is None and not configured():
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces but the treadle[otel] extra is not installed; "
            "tracing is off"
        )
        return False
    from app.core.version import treadle_version

    current = trace.get_tracer_provider()
    if processor is None and isinstance(current, TracerProvider):
        provider, owns = current, False
    else:
        resource = Resource.create({SERVICE_VERSION: treadle_version()})
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: service_name}))
        provider = TracerProvider(
            resource=resource, id_generator=_id_generator(), shutdown_on_exit=True
        )
        owns = True
        if processor is not None:
            provider.add_span_processor(processor)
        else:
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            for exporter in _exporters():
                provider.add_span_processor(BatchSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
    _provider, _owns_provider = provider, owns
    _tracer = provider.get_tracer(_SCOPE, treadle_version())
    ENABLED = True
    return True


def _exporters() -> list[Any]:
    # OTEL_TRACES_EXPORTER as the SDK reads it: a comma-separated list of names. "otlp"
    # picks the transport by protocol; other names are the SDK's registered exporters
    # (entry points ``opentelemetry_traces_exporter``: console, zipkin_json, ...).
    from importlib.metadata import entry_points

    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    out: list[Any] = []
    for name in (n.strip() for n in names.split(",")):
        if not name or name == "none":
            continue
        if name == "otlp":
            protocol = (
                os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            ).strip()
            if protocol == "http/protobuf":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                out.append(OTLPSpanExporter())
                continue
            if protocol != "grpc":
                raise ValueError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported for traces: "
                    "use http/protobuf (installed by treadle[otel]) or grpc"
                )
            name = "otlp_proto_grpc"
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides "
                "(otlp over http/protobuf comes with treadle[otel]; grpc needs "
                "opentelemetry-exporter-otlp-proto-grpc)"
            )
        out.append(next(iter(found)).load()())
    return out


def shutdown() -> None:
    """Flush and stop this process's tracing (idempotent); tracing is off afterwards.

    The provider Treadle created is shut down (its batch processors export what they
    hold); one installed by someone else is only flushed.
    """
    global ENABLED, _tracer, _provider, _owns_provider
    provider, owns = _provider, _owns_provider
    ENABLED, _tracer, _provider, _owns_provider = False, None, None, False
    if provider is None:
        return
    if owns:
        provider.shutdown()
    else:
        provider.force_flush()


# --- the API: POST /runs ------------------------------------------------------------


@contextlib.contextmanager
def request_span(
    method: str, route: str, headers: Mapping[str, str], attributes: Mapping[Any, Any]
) -> Iterator[Span]:
    """A SERVER span for one HTTP request, current for the request's handling.

    Its parent is the request's W3C ``traceparent``/``tracestate``. Named ``<method>
    <route>`` with the HTTP server attributes of OpenTelemetry's semantic conventions
    (``attributes``: ``url.path``, ``server.address`` …); the caller sets
    ``http.response.status_code`` on the yielded span. An exception escaping the
    request is recorded (status ERROR). Call only when :data:`ENABLED`.
    """
    from opentelemetry.propagators.textmap import DefaultGetter
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    assert _tracer is not None, "request_span is only called while tracing is enabled"
    parent = TraceContextTextMapPropagator().extract(dict(headers), getter=DefaultGetter())
    with _tracer.start_as_current_span(
        f"{method} {route}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method, "http.route": route, **attributes},
    ) as span:
        yield span


def set_status_code(span: Span, status: int) -> None:
    """Record a response status on a :func:`request_span` span (5xx: status ERROR).

    Per the HTTP semantic conventions a server span is an error for 5xx only: a 4xx is
    the client's mistake.
    """
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))


def submit_context(headers: Mapping[str, str]) -> TraceContext | None:
    """The trace context to store with a run submitted by this request.

    Traced: the current span's (the ``POST /runs`` span). Not traced: the client's own
    ``traceparent``/``tracestate`` passed through unchanged (W3C Trace Context §2: a
    participant that does not trace forwards the context), so workers that trace still
    join the client's trace. None without either.
    """
    if not ENABLED:
        return TraceContext.from_headers(headers)
    return current_context() or TraceContext.from_headers(headers)


def annotate(**attributes: Any) -> None:
    """Add ``treadle.<name>`` attributes to the current span (no-op when off or no span)."""
    if not ENABLED:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(f"treadle.{key}", str(value))


def current_context() -> TraceContext | None:
    """The current span's W3C context (None when off or outside a span)."""
    if not ENABLED:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return TraceContext.from_headers(carrier)


def current_headers() -> dict[str, str]:
    """W3C headers (``traceparent``, ``tracestate``) of the current span; ``{}`` when off.

    What ``ctx.trace_context`` returns: inside a step, the step attempt's span; in the
    workflow body, the execution's span.
    """
    context = current_context()
    return {} if context is None else context.headers()


def inherit(run: Mapping[Any, Any]) -> TraceContext | None:
    """The trace context a run created by ``run``'s execution (a child run) starts with.

    Traced: the current span's (the parent's execution), so the child's executions nest
    under the execution that created it, in the parent's trace. Not traced: the parent's
    stored context, passed through.
    """
    return current_context() or TraceContext.of_run(run)


# --- the worker: executions, steps, waits -----------------------------------------------


@contextlib.contextmanager
def execution_span(run: Mapping[Any, Any], worker_id: str) -> Iterator[None]:
    """One execution of a claimed run: a span, current for the block, when tracing is on.

    Its parent is the run's stored context (:meth:`TraceContext.of_run`), so all the
    executions of one run are in the trace of its submission. The step attempts of the
    execution share that parent and link to the execution's span (:func:`step_call`):
    a span is exported only when it ends, so a worker killed mid-execution never exports
    its execution span, and steps nested under it would hang from a parent no backend
    has; siblings under the stored context keep the trace connected through any crash
    (docs/adr/0026-traces-as-an-optional-extra.md). A run stored without one
    (a schedule's fire, a rerun, an untraced submission without ``traceparent``) is
    traced under the trace id of its run id (the UUID's 128 bits), each execution a root
    span of that one trace. Attributes: ``treadle.run_id``, ``treadle.workflow``,
    ``treadle.workflow_version``, ``treadle.attempt`` (the claim count),
    ``treadle.worker_id`` and ``treadle.tenant_id``. An exception escaping the block
    (lease lost, database fault, cancellation) is recorded, status ERROR.
    """
    if not ENABLED:
        yield
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    assert _tracer is not None
    stored = TraceContext.of_run(run)
    parent = None if stored is None else TraceContextTextMapPropagator().extract(stored.headers())
    # Read by _RunTraceIds while this root span is created (our own provider only).
    forced = _root_trace_id.set(_run_trace_id(run["run_id"])) if stored is None else None
    try:
        span = _tracer.start_span(
            f"run {run['workflow']}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "treadle.run_id": str(run["run_id"]),
                "treadle.workflow": str(run["workflow"]),
                "treadle.workflow_version": str(run["version"]),
                "treadle.attempt": int(run["attempt"]),
                "treadle.worker_id": worker_id,
                "treadle.tenant_id": str(run["tenant_id"]),
            },
        )
    finally:
        if forced is not None:
            _root_trace_id.reset(forced)
    placed = _step_parent.set(
        _StepParent(parent, None)
        if stored is not None
        else _StepParent(None, _run_trace_id(run["run_id"]))
    )
    try:
        with trace.use_span(span, end_on_exit=True):
            yield
    finally:
        _step_parent.reset(placed)


@dataclass(frozen=True, slots=True)
class _StepParent:
    """Where the current execution's step spans go.

    ``context``: the run's stored context, their parent; None for a run stored without
    one, whose steps are root spans in the trace ``trace_id`` (its run id).
    """

    context: Any
    trace_id: int | None


_step_parent: contextvars.ContextVar[_StepParent | None] = contextvars.ContextVar(
    "treadle_step_parent", default=None
)


def _run_trace_id(run_id: Any) -> int | None:
    value = getattr(run_id, "int", None)
    return value if isinstance(value, int) and value else None


def execution_outcome(status: str, reason: str | None, error: Mapping[Any, Any] | None) -> None:
    """Record what an execution decided on its span: the run's next status and reason.

    ``status``: ``completed``, a terminal failure (``failed``, ``compensated``,
    ``cancelled``: status ERROR except for a cancel) or a release (``retrying``,
    ``waiting_*``, ``queued``). ``error``: the run's error (its ``type`` and
    ``message`` describe the ERROR status).
    """
    if not ENABLED:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    span = trace.get_current_span()
    span.set_attribute("treadle.run.status", status)
    if reason is not None:
        span.set_attribute("treadle.run.reason", reason)
    if status in ("failed", "compensated"):
        kind = str((error or {}).get("type", "Error"))
        span.set_attribute("error.type", kind)
        message = str((error or {}).get("message", ""))[:500]
        span.set_status(Status(StatusCode.ERROR, f"{kind}: {message}" if message else kind))


def step_call(
    call: Awaitable[T], *, step_id: str, name: str, attempt: int, kind: str
) -> Awaitable[T]:
    """Wrap one step attempt's call in a span (``call`` itself when tracing is off).

    The span is a sibling of the execution's span, under the run's stored context, with a
    link to the execution's span (see :func:`execution_span` for why); outside an
    execution it is a child of the current span. It is current while the step's code
    runs (sync steps too: their thread gets a copy of the context), so its outgoing
    calls can carry it (``ctx.trace_context``). Attributes: ``treadle.step`` (the step
    id), ``treadle.attempt``, ``treadle.step.kind`` and ``code.function.name``. An
    exception (the attempt's error, its timeout) is recorded, status ERROR.
    """
    if not ENABLED:
        return call
    return _traced_step(call, step_id=step_id, name=name, attempt=attempt, kind=kind)


async def _traced_step(
    call: Awaitable[T], *, step_id: str, name: str, attempt: int, kind: str
) -> T:
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    assert _tracer is not None
    attributes: dict[str, str | int] = {
        "treadle.step": step_id,
        "treadle.attempt": attempt,
        "treadle.step.kind": kind,
        "code.function.name": name,
    }
    placed = _step_parent.get()
    if placed is None:
        with _tracer.start_as_current_span(f"step {name}", attributes=attributes):
            return await call
    execution = trace.get_current_span().get_span_context()
    forced = _root_trace_id.set(placed.trace_id) if placed.context is None else None
    try:
        span = _tracer.start_span(
            f"step {name}",
            # An empty context makes a root span (in the run id's trace), not a child of
            # the execution's span that is current here.
            context=placed.context if placed.context is not None else otel_context.Context(),
            links=[trace.Link(execution)] if execution.is_valid else None,
            attributes=attributes,
        )
    finally:
        if forced is not None:
            _root_trace_id.reset(forced)
    with trace.use_span(
        span, end_on_exit=True, record_exception=True, set_status_on_exception=True
    ):
        return await call


def wait_event(kind: str, name: str, delay: float | None) -> None:
    """Add a ``treadle.wait`` event to the current span: the run is released to wait.

    ``kind``: timer, signal, approval, child, retry or pause; ``name``: the signal,
    approval, child run or step waited on; ``delay``: seconds until it is due (None:
    until woken).
    """
    if not ENABLED:
        return
    from opentelemetry import trace

    attributes: dict[str, Any] = {"treadle.wait.kind": kind, "treadle.wait.name": name}
    if delay is not None:
        attributes["treadle.wait.delay_seconds"] = float(delay)
    trace.get_current_span().add_event("treadle.wait", attributes)


def execution(
    work: Coroutine[Any, Any, T], run: Mapping[Any, Any], worker_id: str
) -> Coroutine[Any, Any, T]:
    """``work`` (one execution of a claimed run) inside its :func:`execution_span`.

    ``work`` itself when tracing is off. The span is current while ``work`` runs, so the
    workflow body's tasks, its step spans and its child runs all descend from it.
    """
    if not ENABLED:
        return work
    return _traced_execution(work, run, worker_id)


async def _traced_execution(
    work: Coroutine[Any, Any, T], run: Mapping[Any, Any], worker_id: str
) -> T:
    with execution_span(run, worker_id):
        return await work


def record_error(exc: BaseException) -> None:
    """Record ``exc`` on the current span (an exception event), status ERROR; no-op when off."""
    if not ENABLED:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    span = trace.get_current_span()
    span.record_exception(exc)
    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))
