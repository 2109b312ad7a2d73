"""One trace per run over real processes, through a kill -9 (docs/operations.md#traces).

The API and two worker processes export over OTLP/HTTP (the SDK's exporter behind a
``BatchSpanProcessor`` with a 100 ms schedule delay) to a receiver this test runs on
127.0.0.1. A run is submitted with a client ``traceparent``; the first worker is killed
while a step is held; a second worker finishes the run.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.conftest import Stack
from tests.helpers import wait_for_sync
from tests.support.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver

CLIENT_TRACE = uuid.uuid4().hex
CLIENT_SPAN = uuid.uuid4().hex[:16]
HANDLERS = "tests.acceptance.trace_handlers"
pytestmark = pytest.mark.timeout(300)  # an API and two worker processes on a loaded machine
SERVER, CONSUMER = 2, 5  # OTLP Span.SpanKind values
ERROR = 2  # OTLP Status.StatusCode.STATUS_CODE_ERROR


@pytest.fixture
def receiver(stack_env: dict[str, str]) -> Iterator[Receiver]:
    """An OTLP receiver, and the stack's processes told to export to it.

    Requested before ``stack``, so the API process starts with these variables too.
    """
    with otlp_receiver() as received:
        stack_env.update(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": received.url,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_TRACES_SAMPLER": "parentbased_always_on",
            }
        )
        yield received


def render(spans: list[ReceivedSpan], root: str) -> str:
    """The trace as an indented tree of ``name [service] attributes`` lines.

    Spans whose parent was never exported would hang under a ``(not exported)`` line for
    that parent (step spans link to their execution, so none should).
    """
    by_parent: dict[str | None, list[ReceivedSpan]] = {}
    ids = {s.span_id for s in spans}
    for s in spans:
        by_parent.setdefault(s.parent_span_id, []).append(s)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in by_parent.get(parent, []):
            keys = ("treadle.step", "treadle.attempt", "treadle.run.status", "treadle.worker_id")
            shown = " ".join(f"{k}={s.attributes[k]}" for k in keys if k in s.attributes)
            shown += "".join(f" link={link}" for link in s.links)
            lines.append(f"{'  ' * depth}{s.name} [{s.service}] {s.span_id} {shown}".rstrip())
            walk(s.span_id, depth + 1)

    lines.append(f"client span {root} (the test's traceparent)")
    walk(root, 1)
    for parent, children in by_parent.items():
        if parent is not None and parent not in ids and parent != root:
            lines.append(f"  (not exported: {parent})")
            for s in children:
                lines.append(f"    {s.name} [{s.service}] {s.span_id}")
                walk(s.span_id, 3)
    return "\n".join(lines)


def test_one_trace_per_run_through_a_worker_kill(receiver: Receiver, stack: Stack) -> None:
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"tr-{uuid.uuid4().hex[:8]}"
    doomed = stack.start_worker(HANDLERS)
    with stack.client() as c:
        resp = c.post(
            "/runs",
            json={"workflow": "acc-traced", "input": {"name": name}},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
        )
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["run_id"]

    def of_trace() -> list[ReceivedSpan]:
        return [s for s in receiver.spans() if s.trace_id == CLIENT_TRACE]

    # Held in its second step on worker 1, whose first step span has been exported.
    wait_for_sync(
        lambda: list(shared.glob(f"{name}.started.*.{doomed.pid}")), what="step held on worker 1"
    )
    wait_for_sync(
        lambda: [s for s in of_trace() if s.name == "step before"], what="worker 1's step span"
    )
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    (shared / f"{name}.release").touch()
    survivor = stack.start_worker(HANDLERS)
    with stack.client() as c:

        def done() -> dict[str, object] | None:
            body = c.get(f"/runs/{run_id}/result", params={"wait": 5}).json()
            return body if body["done"] else None

        result = wait_for_sync(done, timeout=60, what="run result")
    assert result["status"] == "completed", result

    def complete() -> list[ReceivedSpan] | None:
        spans = of_trace()
        names = [s.name for s in spans]
        wanted = ["POST /runs", "run acc-traced", "step hold", "step finish"]
        return spans if all(n in names for n in wanted) else None

    spans = wait_for_sync(complete, timeout=30, what="the survivor's spans exported")
    tree = render(spans, CLIENT_SPAN)
    print(f"\ntrace {CLIENT_TRACE} of run {run_id}:\n{tree}")

    # Every span of the run is in the client's trace (spans of other traces: none here).
    assert all(s.trace_id == CLIENT_TRACE for s in receiver.spans()), tree
    (post,) = [s for s in spans if s.name == "POST /runs"]
    assert post.parent_span_id == CLIENT_SPAN
    assert post.kind == SERVER
    assert post.service == "treadle-api"
    assert post.attributes["treadle.run_id"] == run_id
    assert post.attributes["http.response.status_code"] == 201

    # Only the survivor's execution ended (the killed one's span died with its process);
    # it is the run's second claim, a child of the POST span, as every execution is.
    (execution,) = [s for s in spans if s.name == "run acc-traced"]
    assert execution.parent_span_id == post.span_id
    assert execution.kind == CONSUMER
    assert execution.service == "treadle-worker"
    assert execution.attributes["treadle.attempt"] == 2
    assert execution.attributes["treadle.run_id"] == run_id
    assert f":{survivor.pid}:" in str(execution.attributes["treadle.worker_id"])
    assert execution.attributes["treadle.run.status"] == "completed"

    # Every step attempt is a child of the POST span, as the executions are, linked to the
    # execution it ran in: worker 1's step links to worker 1's execution (never exported:
    # it died with its process), yet it is in the tree, not hanging from a missing parent.
    ids = {s.span_id for s in spans}
    assert all(s.parent_span_id in ids | {CLIENT_SPAN} for s in spans), tree
    (before,) = [s for s in spans if s.name == "step before"]
    assert before.parent_span_id == post.span_id
    assert len(before.links) == 1 and before.links[0] not in ids | {execution.span_id}
    assert before.attributes["treadle.attempt"] == 1
    # The survivor re-ran the held step (attempt 2: attempt 1 was cut short) and the last
    # one, both linked to its execution; the journaled first step was not re-run.
    holds = [s for s in spans if s.name == "step hold"]
    assert [(s.parent_span_id, s.links, s.attributes["treadle.attempt"]) for s in holds] == [
        (post.span_id, [execution.span_id], 2)
    ]
    (last,) = [s for s in spans if s.name == "step finish"]
    assert (last.parent_span_id, last.links) == (post.span_id, [execution.span_id])
    assert all(s.status_code != ERROR for s in spans), tree
