"""app/core/tracing.py without a database: when tracing is on, header parsing, exporters."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.core import tracing
from app.core.tracing import TraceContext

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
    ):
        monkeypatch.delenv(name, raising=False)
    yield
    tracing.shutdown()


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),  # nothing configured: off, although the SDK would default to localhost
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_configured_follows_the_otel_variables(env: dict[str, str], on: bool) -> None:
    assert tracing.configured(env) is on


def test_setup_does_nothing_unless_configured() -> None:
    assert tracing.setup("treadle-test") is False
    assert tracing.ENABLED is False


def test_off_is_free_the_call_itself_is_returned() -> None:
    assert not tracing.ENABLED

    async def work() -> int:
        return 1

    coro = work()
    assert tracing.execution(coro, {}, "w") is coro
    assert tracing.step_call(coro, step_id="s", name="s", attempt=1, kind="step") is coro
    assert asyncio.run(coro) == 1
    assert tracing.current_headers() == {}
    tracing.wait_event("signal", "go", None)  # no-ops, no error
    tracing.annotate(run_id="r")
    tracing.record_error(RuntimeError("x"))


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"traceparent": PARENT}, TraceContext(PARENT)),
        ({"traceparent": PARENT, "tracestate": "a=1,b=2"}, TraceContext(PARENT, "a=1,b=2")),
        ({"traceparent": f" {PARENT} "}, TraceContext(PARENT)),
        ({"traceparent": PARENT, "tracestate": "x" * 513}, TraceContext(PARENT)),
        ({"traceparent": PARENT, "tracestate": "a=1\x00"}, TraceContext(PARENT)),
        ({}, None),
        ({"traceparent": ""}, None),
        ({"traceparent": PARENT.upper()}, None),  # W3C: lowercase hex only
        ({"traceparent": "ff" + PARENT[2:]}, None),  # version ff is invalid
        ({"traceparent": "00-" + "0" * 32 + PARENT[35:]}, None),  # all-zero trace id
        ({"traceparent": PARENT[:36] + "0" * 16 + "-01"}, None),  # all-zero parent id
        ({"traceparent": PARENT + "-extra"}, None),
        ({"traceparent": "not a traceparent"}, None),
    ],
)
def test_trace_context_from_headers(headers: dict[str, str], expected: TraceContext | None) -> None:
    assert TraceContext.from_headers(headers) == expected


def test_trace_context_of_run_and_headers() -> None:
    assert TraceContext.of_run({"trace_parent": None, "trace_state": None}) is None
    ctx = TraceContext.of_run({"trace_parent": PARENT, "trace_state": "k=v"})
    assert ctx == TraceContext(PARENT, "k=v")
    assert ctx.headers() == {"traceparent": PARENT, "tracestate": "k=v"}
    assert TraceContext(PARENT).headers() == {"traceparent": PARENT}


def test_submit_context_passes_the_client_context_through_when_off() -> None:
    assert tracing.submit_context({"traceparent": PARENT}) == TraceContext(PARENT)
    assert tracing.submit_context({"traceparent": "junk"}) is None


def test_exporters_from_otel_traces_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [type(e) for e in tracing._exporters()] == [OTLPSpanExporter]  # default: otlp
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,console")
    assert [type(e) for e in tracing._exporters()] == [OTLPSpanExporter, ConsoleSpanExporter]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert tracing._exporters() == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaegerish"}, "'jaegerish', which no installed package"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "'http/json' is not supported"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, "'otlp_proto_grpc', which no"),
    ],
)
def test_unknown_exporters_are_refused_clearly(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=message):
        tracing.setup("treadle-test")
    assert tracing.ENABLED is False


@pytest.mark.parametrize(
    ("env", "service"),
    [
        ({}, "treadle-worker"),
        ({"OTEL_SERVICE_NAME": "billing-worker"}, "billing-worker"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,team=pay"}, "from-attrs"),
    ],
)
def test_service_name_defaults_unless_the_environment_names_one(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], service: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    exporter = InMemorySpanExporter()
    assert tracing.setup("treadle-worker", processor=SimpleSpanProcessor(exporter))

    async def step() -> dict[str, str]:
        return tracing.current_headers()

    async def main() -> dict[str, str]:
        return await tracing.step_call(step(), step_id="s#2", name="s", attempt=3, kind="step")

    headers = asyncio.run(main())
    tracing.shutdown()
    (span,) = exporter.get_finished_spans()
    assert span.resource.attributes["service.name"] == service
    assert span.name == "step s"
    assert dict(span.attributes or {}) == {
        "treadle.step": "s#2",
        "treadle.attempt": 3,
        "treadle.step.kind": "step",
        "code.function.name": "s",
    }
    # Inside the step, the current headers are the step span's own context.
    flags = int(span.context.trace_flags)
    assert flags & 1, "sampled"
    assert headers["traceparent"] == (
        f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{flags:02x}"
    )


def test_configured_but_extra_missing_warns_and_stays_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    # As if the extra were not installed: importing the package fails.
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    assert tracing.setup("treadle-worker") is False
    assert tracing.ENABLED is False
    assert "treadle[otel] extra is not installed" in capsys.readouterr().out


def test_off_imports_nothing_of_the_sdk() -> None:
    # A fresh interpreter: the worker and the engine import no OpenTelemetry module at
    # all, and the API none of the SDK (FastAPI itself may import the API package).
    code = (
        "import sys, app.core.tracing, app.worker.worker, app.engine.executor, app.sdk\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "import app.api.app\n"
        "from app.core import tracing\n"
        "assert tracing.setup('x') is False\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.sdk')]\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
