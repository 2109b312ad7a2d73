"""A tiny OTLP/HTTP trace receiver on 127.0.0.1 for tests: spans as plain records.

Accepts ``POST /v1/traces`` bodies of ``ExportTraceServiceRequest`` (protobuf, optionally
gzip), the OTLP/HTTP binary encoding the SDK's exporter sends (OTLP specification,
"OTLP/HTTP"), and answers an empty ``ExportTraceServiceResponse``.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: ids in lowercase hex, attributes as Python values."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    status_code: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    service: str
    links: list[str]  # the span ids this span links to


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


@dataclass
class Receiver:
    """What the receiver has collected so far (thread-safe reads via :meth:`spans`)."""

    url: str = ""
    _spans: list[ReceivedSpan] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[ReceivedSpan]:
        """A copy of every span received."""
        with self._lock:
            return list(self._spans)

    def add(self, request: ExportTraceServiceRequest) -> None:
        """Flatten one export request into :class:`ReceivedSpan` records."""
        out: list[ReceivedSpan] = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append(
                        ReceivedSpan(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex() or None,
                            name=s.name,
                            kind=int(s.kind),
                            status_code=int(s.status.code),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            events=[
                                (e.name, {a.key: _value(a.value) for a in e.attributes})
                                for e in s.events
                            ],
                            service=str(resource.get("service.name", "")),
                            links=[link.span_id.hex() for link in s.links],
                        )
                    )
        with self._lock:
            self._spans.extend(out)


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """Serve an OTLP/HTTP trace endpoint on a free 127.0.0.1 port until the block ends.

    ``Receiver.url`` is the base URL to give as ``OTEL_EXPORTER_OTLP_ENDPOINT``.
    """
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.add(request)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the test's output is the trace tree

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    received.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
