"""Traces in-process: the API's POST /runs span, executions, step attempts, waits, children.

The SDK's in-memory exporter behind our own provider (``tracing.setup(processor=…)``),
the real API app over ASGI and a real in-process worker, on both databases.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

from app.core import tracing
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import runs as runs_q
from app.engine.registry import Registry
from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow
from tests.conftest import make_settings
from tests.integration import support

TENANT = "tracer"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"

# What step code saw as ctx.trace_context, by step id (one worker process: a dict will do).
SEEN: dict[str, dict[str, str]] = {}
FAILS: dict[str, int] = {}


class In(BaseModel):
    n: int


def kid_step(n: int) -> int:
    return n


def flaky(n: int) -> int:
    # Sync on purpose: the step span must reach the worker thread too.
    key = str(current_step().run_id)
    FAILS[key] = FAILS.get(key, 0) + 1
    if FAILS[key] == 1:
        raise RuntimeError("first attempt fails")
    return n + 1


@workflow("traced-kid")
async def kid(ctx: WorkflowContext, x: In) -> int:
    return x.n * 2


@workflow("traced")
async def traced(ctx: WorkflowContext, x: In) -> int:
    async def look() -> int:
        SEEN[str(ctx.run_id)] = ctx.trace_context
        return 1

    await ctx.step(look)
    n = await ctx.step(flaky, x.n, retry=RetryPolicy(max_attempts=3, backoff="fixed", delay=0.01))
    await ctx.signal("go")
    doubled = await ctx.child(kid, In(n=n))
    return int(doubled)


REGISTRY = Registry([traced, kid])


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.setup("treadle-test", processor=SimpleSpanProcessor(exporter))
    try:
        yield exporter
    finally:
        tracing.shutdown()
    assert not tracing.ENABLED


def _id(span_id: int) -> str:
    return format(span_id, "016x")


def _parent(span: ReadableSpan) -> str | None:
    return None if span.parent is None else _id(span.parent.span_id)


def _linked(span: ReadableSpan) -> set[str]:
    return {_id(link.context.span_id) for link in span.links}


def _of_run(found: tuple[ReadableSpan, ...], run_id: uuid.UUID) -> list[ReadableSpan]:
    return [s for s in found if (s.attributes or {}).get("treadle.run_id") == str(run_id)]


async def test_one_trace_from_post_through_executions_steps_waits_and_children(
    spans: InMemorySpanExporter, settings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with (
        support.workers(settings, db, REGISTRY),
        support.api_client(settings, db, TENANT) as client,
    ):
        r = await client.post(
            "/runs",
            json={"workflow": "traced", "input": {"n": 3}},
            headers={"traceparent": TRACEPARENT, "tracestate": "vendor=abc"},
        )
        assert r.status_code == 201, r.text
        run_id = uuid.UUID(r.json()["run_id"])
        await support.reach(db, TENANT, run_id, "waiting_signal")
        sent = await client.post(f"/runs/{run_id}/signals/go", json={"payload": None})
        assert sent.status_code in (200, 201, 202), sent.text
        row = await support.reach(db, TENANT, run_id, "completed")
        assert row["output"] == "8"

    found = spans.get_finished_spans()
    assert {s.context.trace_id for s in found} == {int(CLIENT_TRACE, 16)}, "one trace"

    # POST /runs: a SERVER span, child of the client's span; its context is the run's.
    (post,) = [s for s in found if s.name == "POST /runs"]
    assert post.kind is SpanKind.SERVER
    assert _parent(post) == CLIENT_SPAN
    assert post.parent is not None and post.parent.is_remote
    attrs = post.attributes or {}
    assert attrs["http.request.method"] == "POST"
    assert attrs["http.route"] == "/runs"
    assert attrs["http.response.status_code"] == 201
    assert attrs["treadle.run_id"] == str(run_id)
    assert row["trace_parent"] == f"00-{CLIENT_TRACE}-{_id(post.context.span_id)}-01"
    assert row["trace_state"] == "vendor=abc"

    # Three executions (to the signal, to the child, to the end), children of the POST span.
    mine = _of_run(found, run_id)
    executions = sorted(
        (s for s in mine if s.name == "run traced"), key=lambda e: e.start_time or 0
    )
    assert all(_parent(e) == _id(post.context.span_id) for e in executions)
    assert [(e.attributes or {})["treadle.attempt"] for e in executions] == [1, 2, 3]
    assert [(e.attributes or {})["treadle.run.status"] for e in executions] == [
        "waiting_signal",
        "waiting_child",
        "completed",
    ]
    assert all(e.kind is SpanKind.CONSUMER for e in executions)
    first, second, _third = executions
    assert (first.attributes or {})["treadle.workflow"] == "traced"
    assert (first.attributes or {})["treadle.workflow_version"] == "1"
    # Each wait is an event of the execution it released.
    for execution, kind, name in ((first, "signal", "go"), (second, "child", None)):
        (wait,) = [e for e in execution.events if e.name == "treadle.wait"]
        assert (wait.attributes or {})["treadle.wait.kind"] == kind
        if name is not None:
            assert (wait.attributes or {})["treadle.wait.name"] == name

    # Step attempts (journaled steps are not re-run): siblings of the executions under the
    # POST span, each linked to the execution it ran in (the first), so a killed worker's
    # unexported execution span leaves no step without its parent.
    steps = [s for s in found if s.name.startswith("step ")]
    by_name: dict[str, list[ReadableSpan]] = {}
    for s in steps:
        by_name.setdefault(s.name, []).append(s)
    first_ids = {_id(first.context.span_id)}
    look_span = next(s for s in steps if str((s.attributes or {})["treadle.step"]).endswith("look"))
    assert _parent(look_span) == _id(post.context.span_id)
    assert _linked(look_span) == first_ids
    flaky_spans = sorted(by_name["step flaky"], key=lambda s: s.start_time or 0)
    assert [(s.attributes or {})["treadle.attempt"] for s in flaky_spans] == [1, 2]
    assert all(_parent(s) == _id(post.context.span_id) for s in flaky_spans)
    assert all(_linked(s) == first_ids for s in flaky_spans)
    failed, ok = flaky_spans
    assert failed.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in failed.events)
    assert ok.status.status_code is not StatusCode.ERROR

    # ctx.trace_context inside a step is that step attempt's span.
    seen = SEEN[str(run_id)]
    assert seen["traceparent"] == f"00-{CLIENT_TRACE}-{_id(look_span.context.span_id)}-01"
    assert seen["tracestate"] == "vendor=abc"

    # The child run: in the parent's trace, under the execution that created it.
    child_execs = [s for s in found if s.name == "run traced-kid"]
    assert len(child_execs) == 1
    assert _parent(child_execs[0]) == _id(second.context.span_id)


async def test_failed_run_marks_its_execution_span_as_error(
    spans: InMemorySpanExporter, settings: Settings, db: Database
) -> None:
    def boom() -> None:
        raise ValueError("no good")

    @workflow("traced-fails")
    async def fails(ctx: WorkflowContext, x: In) -> None:
        await ctx.step(boom, retry=RetryPolicy(max_attempts=1))

    registry = Registry([fails])
    run_id = await support.submit(db, settings, registry, TENANT, "traced-fails", n=1)
    async with support.workers(settings, db, registry):
        await support.reach(db, TENANT, run_id, "failed")
    found = _of_run(spans.get_finished_spans(), run_id)
    (execution,) = [s for s in found if s.name == "run traced-fails"]
    # Submitted outside a request and without a context: a root span, of the trace whose
    # id is the run id.
    assert execution.parent is None
    assert execution.context.trace_id == run_id.int
    assert execution.status.status_code is StatusCode.ERROR
    assert "ValueError" in (execution.status.description or "")
    assert (execution.attributes or {})["treadle.run.reason"] == "failure_attempts_exhausted"
    (step,) = [s for s in spans.get_finished_spans() if s.name.endswith("boom")]
    # A root of the same trace (the run id's), linked to its execution.
    assert step.parent is None
    assert step.context.trace_id == run_id.int
    assert _linked(step) == {_id(execution.context.span_id)}
    assert step.status.status_code is StatusCode.ERROR
    (event,) = [e for e in step.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"] == "ValueError"


async def test_untraced_api_passes_the_client_context_through(
    settings: Settings, db: Database
) -> None:
    assert not tracing.ENABLED
    async with db.write() as conn:
        await REGISTRY.register(conn)
    async with support.api_client(settings, db, TENANT) as client:
        kept = await client.post(
            "/runs",
            json={"workflow": "traced-kid", "input": {"n": 1}},
            headers={"traceparent": TRACEPARENT, "tracestate": "k=v"},
        )
        bad = await client.post(
            "/runs",
            json={"workflow": "traced-kid", "input": {"n": 2}},
            headers={"traceparent": "00-" + "0" * 32 + "-" + CLIENT_SPAN + "-01"},
        )
        none = await client.post("/runs", json={"workflow": "traced-kid", "input": {"n": 3}})
    rows: dict[str, Any] = {}
    async with db.read() as conn:
        for name, resp in (("kept", kept), ("bad", bad), ("none", none)):
            assert resp.status_code == 201, resp.text
            rows[name] = await runs_q.get_run(conn, TENANT, uuid.UUID(resp.json()["run_id"]))
    assert (rows["kept"]["trace_parent"], rows["kept"]["trace_state"]) == (TRACEPARENT, "k=v")
    assert rows["bad"]["trace_parent"] is None  # an all-zero trace id is invalid (W3C §3.2.2.3)
    assert rows["none"]["trace_parent"] is None


async def test_a_run_without_context_is_one_trace_under_its_run_id(
    spans: InMemorySpanExporter, database_url: str, tmp_path: Path
) -> None:
    @workflow("traced-naps")
    async def naps(ctx: WorkflowContext, x: In) -> int:
        await ctx.sleep(0.2)  # released: inline_retry_max_seconds is 0 here
        return await ctx.step(kid_step, x.n)

    settings = make_settings(database_url, tmp_path, inline_retry_max_seconds=0.0)
    db = Database(settings)
    try:
        registry = Registry([naps])
        run_id = await support.submit(db, settings, registry, TENANT, "traced-naps", n=4)
        async with support.workers(settings, db, registry):
            await support.reach(db, TENANT, run_id, "completed")
    finally:
        await db.dispose()
    found = _of_run(spans.get_finished_spans(), run_id)
    executions = [s for s in found if s.name == "run traced-naps"]
    assert len(executions) == 2
    assert all(e.parent is None for e in executions)
    assert {e.context.trace_id for e in executions} == {run_id.int}
    (timer,) = [e for e in executions[0].events if e.name == "treadle.wait"]
    assert (timer.attributes or {})["treadle.wait.kind"] == "timer"
    (step,) = [s for s in spans.get_finished_spans() if s.name == "step kid_step"]
    assert step.context.trace_id == run_id.int


async def test_a_refused_submission_is_a_span_with_its_status_and_no_run(
    spans: InMemorySpanExporter, settings: Settings, db: Database
) -> None:
    async with support.api_client(settings, db, TENANT) as client:
        r = await client.post(
            "/runs",
            json={"workflow": "nobody-registered-this", "input": {}},
            headers={"traceparent": TRACEPARENT},
        )
        # Other routes are not spanned.
        assert (await client.get("/runs")).status_code == 200
    assert r.status_code == 404
    (span,) = spans.get_finished_spans()
    assert span.name == "POST /runs"
    assert _parent(span) == CLIENT_SPAN
    assert (span.attributes or {})["http.response.status_code"] == 404
    assert "treadle.run_id" not in (span.attributes or {})
    # A client error is not a server span's error (HTTP semantic conventions).
    assert span.status.status_code is not StatusCode.ERROR
