"""SIGTERM drains a worker.

It stops claiming, finishes in-flight work within the grace period, or releases the lease
at once so another worker takes the run without waiting for the lease to expire.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

from tests.acceptance.conftest import Stack
from tests.helpers import wait_for_sync


def _submit(stack: Stack, name: str) -> str:
    with stack.client() as c:
        resp = c.post("/runs", json={"workflow": "acc-hold", "input": {"name": name}})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["run_id"])


def _started(shared: Path, name: str) -> bool:
    return any(shared.glob(f"{name}.started.*"))


def test_sigterm_finishes_in_flight_step_within_grace(stack: Stack) -> None:
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"drain-{uuid.uuid4().hex[:8]}"
    worker = stack.start_worker(extra_env={"TREADLE_DRAIN_GRACE_SECONDS": "60"})
    run_id = _submit(stack, name)
    wait_for_sync(lambda: _started(shared, name), what="step started")
    worker.send_signal(signal.SIGTERM)
    # Draining: the worker stays up for its in-flight run but claims nothing new.
    later = _submit(stack, f"{name}-later")
    (shared / f"{name}.release").touch()
    assert worker.wait(timeout=60) == 0
    with stack.client() as c:
        run = c.get(f"/runs/{run_id}").json()
        untouched = c.get(f"/runs/{later}").json()
        kinds = [e["kind"] for e in c.get(f"/runs/{later}/events").json()["items"]]
    assert (run["status"], run["output"]) == (
        "completed",
        f"pid-{worker.pid}-attempt-1+finished",
    )
    assert untouched["status"] == "queued"
    # Nothing of it ran. A claim already on its way to the database when SIGTERM arrived
    # cannot be unsent: such a run is claimed once and given back at once, unstarted.
    assert "step_started" not in kinds
    if untouched["attempt"] == 0:
        assert kinds == ["run_submitted"]
    else:
        assert untouched["attempt"] == 1
        assert kinds[0] == "run_submitted"
        assert kinds[-1] == "run_released"
        assert set(kinds) <= {"run_submitted", "run_claimed", "run_released"}


def test_sigterm_past_grace_releases_lease_at_once(stack: Stack) -> None:
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"release-{uuid.uuid4().hex[:8]}"
    # A long lease: if the drain did not release it, the run would sit for 10 minutes.
    slow_lease = {"TREADLE_DRAIN_GRACE_SECONDS": "0.2", "TREADLE_LEASE_TTL_SECONDS": "600"}
    worker = stack.start_worker(extra_env=slow_lease)
    run_id = _submit(stack, name)
    wait_for_sync(lambda: _started(shared, name), what="step started")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    with stack.client() as c:
        run = c.get(f"/runs/{run_id}").json()
        steps = c.get(f"/runs/{run_id}/steps").json()["items"]
    assert (run["status"], run["lease_owner"]) == ("queued", None)
    # The interrupted attempt is not counted against the step's retry budget.
    assert [(s["status"], s["attempt"]) for s in steps] == [("pending", 0)]
    (shared / f"{name}.release").touch()
    successor = stack.start_worker(extra_env={"TREADLE_LEASE_TTL_SECONDS": "600"})
    with stack.client() as c:
        result = wait_for_sync(
            lambda: (b := c.get(f"/runs/{run_id}/result", params={"wait": 5}).json())["done"] and b,
            timeout=60,
            what="run finished by the successor",
        )
    assert result["output"] == f"pid-{successor.pid}-attempt-1+finished"
