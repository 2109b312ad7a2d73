"""Recovering undone runs over real HTTP with worker processes, both databases.

A requeue after a failed compensation finishes the undo and never resumes the body; a
cancel request survives the failed undo, a worker restart and the requeue; a compensation
waiting out a long retry backoff releases the run and resumes on request
(docs/adr/0009-requeue-into-compensation.md).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Stack
from tests.helpers import wait_for_sync

# An API and up to two worker processes start per test, on a loaded machine.
pytestmark = pytest.mark.timeout(360)

HANDLERS = "tests.acceptance.undo_handlers"
TERMINAL = ("completed", "failed", "cancelled", "compensated")


def _shared(stack: Stack) -> Path:
    return Path(stack.env["TREADLE_TEST_DIR"])


def _break(stack: Stack, job: str, *what: str) -> None:
    for w in what:
        (_shared(stack) / f"{job}.{w}.broken").touch()


def _fix(stack: Stack, job: str) -> None:
    for broken in _shared(stack).glob(f"{job}.*.broken"):
        broken.unlink()


def _calls(stack: Stack, job: str) -> list[str]:
    path = _shared(stack) / f"{job}.calls"
    return path.read_text().split() if path.exists() else []


def _wait(stack: Stack, run_id: str, *wanted: str) -> dict[str, Any]:
    with stack.client() as c:

        def probe() -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            return body if body["status"] in wanted else None

        return wait_for_sync(probe, timeout=90, what=f"run {run_id} in {wanted}")


def _steps(stack: Stack, run_id: str) -> dict[str, str]:
    with stack.client() as c:
        items = c.get(f"/runs/{run_id}/steps", params={"limit": 200}).json()["items"]
    return {s["step_id"]: s["status"] for s in items}


def _submit(stack: Stack, workflow: str, job: str) -> str:
    with stack.client() as c:
        resp = c.post("/runs", json={"workflow": workflow, "input": {"name": job}})
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["run_id"]
    return run_id


def test_retry_after_a_failed_undo_finishes_the_undo_and_never_completes(stack: Stack) -> None:
    worker = stack.start_worker(handlers=HANDLERS)
    job = f"trip-{uuid.uuid4().hex[:6]}"
    _break(stack, job, "charge", "undo-flight")
    run_id = _submit(stack, "acc-undo-saga", job)
    failed = _wait(stack, run_id, *TERMINAL)
    assert failed["status"] == "failed"
    assert failed["error"]["compensation_failures"][0]["step_id"] == "flight"
    assert _calls(stack, job) == ["flight", "hotel", "charge", "undo-hotel", "undo-flight"]
    # The worker goes away; the operator fixes everything, the failed charge included:
    # the run must still not resume its body past its undone hotel.
    worker.terminate()
    worker.wait(timeout=30)
    _fix(stack, job)
    with stack.client() as c:
        resp = c.post(
            f"/runs/{run_id}/retry", json={"reason": "undo fixed", "correlation_id": "I-1"}
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["status"] == "requeued"
        requeued = c.get(f"/runs/{run_id}").json()
        assert (requeued["status"], requeued["reason"]) == ("compensating", failed["reason"])
    stack.start_worker(handlers=HANDLERS)
    done = _wait(stack, run_id, *TERMINAL)
    assert (done["status"], done["reason"]) == ("compensated", failed["reason"])
    assert done["error"]["step_id"] == "charge"
    assert "compensation_failures" not in done["error"]
    # Only the failed undo ran again: no step of the body, no second undo of the hotel.
    assert _calls(stack, job)[5:] == ["undo-flight"]
    steps = _steps(stack, run_id)
    assert steps["flight"] == steps["hotel"] == "compensated"
    assert steps["charge"] == "failed"
    assert "finish" not in steps
    with stack.client() as c:
        pending = c.get("/dead-letters", params={"workflow": "acc-undo-saga"}).json()["items"]
        assert all(d["run_id"] != run_id for d in pending)
        assert c.post(f"/runs/{run_id}/retry", json={"reason": "again"}).status_code == 409


def test_cancel_survives_a_failed_undo_and_the_requeue(stack: Stack) -> None:
    worker = stack.start_worker(handlers=HANDLERS)
    job = f"stay-{uuid.uuid4().hex[:6]}"
    _break(stack, job, "undo-hotel")
    run_id = _submit(stack, "acc-undo-waits", job)
    _wait(stack, run_id, "waiting_signal")
    with stack.client() as c:
        resp = c.post(f"/runs/{run_id}/cancel", json={"reason": "customer left"})
        assert resp.status_code == 200, resp.text
    failed = _wait(stack, run_id, *TERMINAL)
    assert failed["status"] == "failed"
    assert _calls(stack, job) == ["flight", "hotel", "undo-hotel", "undo-flight"]
    worker.kill()
    worker.wait(timeout=30)
    _fix(stack, job)
    with stack.client() as c:
        letters = c.get("/dead-letters", params={"workflow": "acc-undo-waits"}).json()["items"]
        (letter,) = [d for d in letters if d["run_id"] == run_id]
        resp = c.post(
            f"/dead-letters/{letter['dead_letter_id']}/requeue", json={"reason": "hotel api back"}
        )
        assert resp.status_code == 200, resp.text
        assert c.get(f"/runs/{run_id}").json()["status"] == "cancelling"
        # Everything a resurrected body would need to go on: the signal it waits for, a
        # resume; neither may bring the run back.
        sent = c.post(f"/runs/{run_id}/signals/go", json={"payload": 1})
        assert sent.status_code == 202, sent.text
    stack.start_worker(handlers=HANDLERS)
    done = _wait(stack, run_id, *TERMINAL)
    assert (done["status"], done["reason"]) == ("cancelled", "canceled_by_request")
    assert _calls(stack, job)[4:] == ["undo-hotel"]
    steps = _steps(stack, run_id)
    assert steps["flight"] == steps["hotel"] == "compensated"
    assert "sleep" not in steps and "finish" not in steps
    with stack.client() as c:
        assert c.post(f"/runs/{run_id}/resume").status_code == 409
        events = c.get(f"/runs/{run_id}/events", params={"limit": 200}).json()["items"]
    kinds = [e["kind"] for e in events]
    after = kinds[kinds.index("dead_letter_requeued") :]
    assert "run_completed" not in kinds and "signal_consumed" not in after


def test_a_compensation_waiting_out_a_long_backoff_is_released_and_resumes(
    stack: Stack,
) -> None:
    stack.start_worker(handlers=HANDLERS, extra_env={"TREADLE_INLINE_RETRY_MAX_SECONDS": "1"})
    job = f"slow-{uuid.uuid4().hex[:6]}"
    _break(stack, job, "charge", "undo-hotel")
    run_id = _submit(stack, "acc-undo-saga", job)

    with stack.client() as c:

        def released() -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            waiting = body.get("waiting_on") or {}
            ok = body["status"] == "compensating" and waiting.get("kind") == "retry"
            return body if ok and body["lease_owner"] is None else None

        row = wait_for_sync(released, timeout=60, what="compensation released")
        assert row["waiting_on"]["name"] == "hotel__compensate"
        _fix(stack, job)
        resp = c.post(f"/runs/{run_id}/resume")
        assert resp.status_code == 200, resp.text
    done = _wait(stack, run_id, *TERMINAL)
    assert (done["status"], done["reason"]) == ("compensated", "failure_non_retryable")
    assert _calls(stack, job) == [
        "flight",
        "hotel",
        "charge",
        "undo-hotel",
        "undo-hotel",
        "undo-flight",
    ]
