"""Rerun from a step over real HTTP and processes (docs/adr/0022-rerun-from-a-step.md).

A run completes on one ``treadle worker``; that worker is killed with SIGKILL; a rerun from
the second step is executed by another worker process: the first step's result is the
original's (replayed from the copied journal, not executed again), the second is new.
"""

from __future__ import annotations

import signal

from tests.acceptance.conftest import Stack
from tests.helpers import wait_for_sync

HANDLERS = "tests.acceptance.rerun_handlers"


def _finished(stack: Stack, run_id: str) -> dict[str, object]:
    def probe() -> dict[str, object] | None:
        with stack.client() as c:
            run: dict[str, object] = c.get(f"/runs/{run_id}").json()
        return run if run["status"] in ("completed", "failed") else None

    return wait_for_sync(probe, timeout=90, what=f"run {run_id} finished")


def test_rerun_from_a_step_replays_the_prefix_on_another_worker_process(stack: Stack) -> None:
    first = stack.start_worker(HANDLERS)
    with stack.client() as c:
        made = c.post("/runs", json={"workflow": "acc-rerun", "input": {"order_id": "o-1"}})
        assert made.status_code == 201, made.text
        original_id = made.json()["run_id"]
        original = _finished(stack, original_id)
        assert original["status"] == "completed", original
        steps = [s["step_id"] for s in c.get(f"/runs/{original_id}/steps").json()["items"]]
        assert len(steps) == 2, steps
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = stack.start_worker(HANDLERS)

        bad = c.post(f"/runs/{original_id}/rerun", json={"from_step": "no-such-step"})
        assert bad.status_code == 422, bad.text
        rerun = c.post(
            f"/runs/{original_id}/rerun",
            json={"from_step": steps[1], "idempotency_key": "rerun-o-1"},
        )
        assert rerun.status_code == 201, rerun.text
        rerun_id = rerun.json()["run_id"]
        assert rerun.json()["rerun_of"] == original_id
        again = c.post(
            f"/runs/{original_id}/rerun",
            json={"from_step": steps[1], "idempotency_key": "rerun-o-1"},
        )
        assert again.status_code == 200 and again.json()["run_id"] == rerun_id, again.text

        done = _finished(stack, rerun_id)
        assert done["status"] == "completed", done
        before, after = original["output"], done["output"]
        assert isinstance(before, dict) and isinstance(after, dict)
        # Replayed: the original's token and the killed worker's pid, not executed again.
        assert after["reserve"] == before["reserve"]
        assert after["reserve"][1] == str(first.pid)
        # Executed afresh by the surviving worker process.
        assert after["charge"][0] != before["charge"][0]
        assert after["charge"][1] == str(second.pid)
        attempts = {
            s["step_id"]: s["attempt"] for s in c.get(f"/runs/{rerun_id}/steps").json()["items"]
        }
        assert attempts[steps[1]] == 1, attempts
