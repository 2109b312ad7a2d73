"""Attempt numbering across kill -9 at every point of a retry: before, during, after a backoff.

An attempt counts when it starts running (docs/guarantees.md): a worker killed while a step
waits out its backoff, inline or with the run released, ran no attempt, so the next
attempt is the one the backoff was for. Real API and worker processes; the step writes each
attempt's number as it begins (tests/acceptance/crash_handlers.py), so the test sees which
attempts ran, whichever worker ran them.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Stack
from tests.helpers import wait_for_sync

HANDLERS = "tests.acceptance.crash_handlers"
# Below TREADLE_INLINE_RETRY_MAX_SECONDS (5 s by default): the worker waits, leased.
INLINE = 3.0
# Above it: the run is released until due.
RELEASED = 7.0


def _submit(stack: Stack, job: dict[str, Any]) -> str:
    with stack.client() as c:
        resp = c.post("/runs", json={"workflow": "crash-backoff", "input": job})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["run_id"])


def _step(stack: Stack, run_id: str) -> dict[str, Any] | None:
    with stack.client() as c:
        items: list[dict[str, Any]] = c.get(f"/runs/{run_id}/steps").json()["items"]
    return items[0] if items else None


def _run(stack: Stack, run_id: str) -> dict[str, Any]:
    with stack.client() as c:
        body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
    return body


def _result(stack: Stack, run_id: str) -> dict[str, Any]:
    with stack.client() as c:

        def done() -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/runs/{run_id}/result", params={"wait": 5}).json()
            return body if body["done"] else None

        return wait_for_sync(done, timeout=90, what="run result")


def _attempts(shared: Path, name: str) -> list[int]:
    path = shared / f"{name}.attempts"
    return [int(n) for n in path.read_text().split()] if path.exists() else []


def _in_backoff(stack: Stack, run_id: str, *, released: bool) -> bool:
    step = _step(stack, run_id)
    if step is None or step["status"] != "retry_wait":
        return False
    # Released: the worker gave the run back for the wait; inline: it still holds it.
    return (_run(stack, run_id)["status"] == "retrying") is released


@pytest.mark.timeout(300)  # three interpreters start on a loaded machine
@pytest.mark.parametrize(
    ("point", "delay", "transactional"),
    [
        ("during", INLINE, False),
        ("during", RELEASED, False),
        ("during", INLINE, True),
        ("before", INLINE, False),
        ("after", INLINE, False),
        ("after", RELEASED, False),
    ],
    ids=[
        "during-inline",
        "during-released",
        "during-inline-transaction",
        "before",
        "after-inline",
        "after-released",
    ],
)
def test_kill_9_around_a_backoff_numbers_attempts_without_a_gap(
    stack: Stack, point: str, delay: float, transactional: bool
) -> None:
    """A step with two attempts fails its first; its worker is killed at ``point``.

    ``before``: during attempt 1, which is lost (not failed), so attempt 2 runs and
    succeeds. ``during``: in the backoff after attempt 1. ``after``: during attempt 2,
    which is lost, so attempt 3 still runs. Whatever the point, the attempts
    that ran are numbered 1, 2(, 3) with no gap, and the run completes on its real tries.
    """
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"{point}-{uuid.uuid4().hex[:8]}"
    hold = {"before": 1, "during": 0, "after": 2}[point]
    doomed = stack.start_worker(HANDLERS)
    run_id = _submit(
        stack, {"name": name, "delay": delay, "hold": hold, "transactional": transactional}
    )
    if point == "during":
        wait_for_sync(
            lambda: _in_backoff(stack, run_id, released=delay == RELEASED),
            timeout=60,
            interval=0.1,
            what="the step waiting out its backoff",
        )
    else:
        wait_for_sync(
            lambda: (shared / f"{name}.holding.{hold}").exists(),
            timeout=60 + delay,
            what=f"attempt {hold} running",
        )

        def listed_running() -> bool:
            # Its start record journaled: an attempt killed younger than that (0.1 s on
            # PostgreSQL, ADR 0040) is counted by the run's lost claims instead, and is
            # not in the timeline (tests/integration/test_fresh_budgets.py covers it).
            step = _step(stack, run_id)
            return step is not None and (step["status"], step["attempt"]) == ("running", hold)

        wait_for_sync(listed_running, timeout=30, what=f"attempt {hold} listed running")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    (shared / f"{name}.release").touch()
    stack.start_worker(HANDLERS)
    result = _result(stack, run_id)
    expected = {"before": [1, 2], "during": [1, 2], "after": [1, 2, 3]}[point]
    assert result["status"] == "completed", result
    assert result["output"] == f"ok on attempt {expected[-1]}"
    assert _attempts(shared, name) == expected
    step = _step(stack, run_id)
    assert step is not None and step["attempt"] == expected[-1], step
    with stack.client() as c:
        events = c.get(f"/runs/{run_id}/events").json()["items"]
    started = [e["data"]["attempt"] for e in events if e["kind"] == "step_started"]
    # The timeline names each attempt that ran once, in order: no attempt that never ran.
    assert started == expected, events
