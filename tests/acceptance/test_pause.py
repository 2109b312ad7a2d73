"""Pause over real HTTP and processes: a worker SIGKILLed while its run is paused.

``treadle serve`` plus ``treadle worker`` subprocesses (tests/acceptance/conftest.py).
The run is paused mid-step, its worker is killed with the attempt in flight, the lease
expires while the run is paused (no worker takes it), and on unpause another worker
claims it, runs the interrupted step again and completes it.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from datetime import datetime
from pathlib import Path

from tests.acceptance.conftest import Stack, cli, token
from tests.helpers import wait_for_sync


def test_worker_killed_while_paused_run_resumes_on_unpause(stack: Stack) -> None:
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"pause-{uuid.uuid4().hex[:8]}"
    doomed = stack.start_worker()
    with stack.client() as c:
        resp = c.post("/runs", json={"workflow": "acc-hold", "input": {"name": name}})
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["run_id"]
        wait_for_sync(
            lambda: list(shared.glob(f"{name}.started.1.{doomed.pid}")), what="step started"
        )
        paused = c.post(f"/runs/{run_id}/pause", json={"reason": "bank adapter fix"})
        assert paused.status_code == 200, paused.text
        assert (paused.json()["paused_by"], paused.json()["pause_reason"]) == (
            "alice",
            "bank adapter fix",
        )
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        (shared / f"{name}.release").touch()
        lease_until = datetime.fromisoformat(c.get(f"/runs/{run_id}").json()["lease_expires_at"])
        # Past the dead worker's lease (same host clock as the database's): a run that was
        # not paused would now be claimable by any worker.
        wait_for_sync(
            lambda: time.time() > lease_until.timestamp() + 0.5, timeout=30, what="lease expiry"
        )
        # Registered and polling (every 0.1 s) with the run's lease long expired: still
        # unclaimed, since a paused run is never claimed.
        survivor = stack.start_worker()
        view = c.get(f"/runs/{run_id}").json()
        assert view["paused_at"] is not None and view["attempt"] == 1, view
        kinds = [e["kind"] for e in c.get(f"/runs/{run_id}/events").json()["items"]]
        assert kinds.count("run_claimed") == 1 and "run_paused" in kinds
    # Unpause with the CLI verb, as an operator would.
    out = cli(
        {**stack.env, "TREADLE_URL": stack.url, "TREADLE_TOKEN": token()},
        "runs",
        "unpause",
        run_id,
        "--output",
        "json",
    )
    assert json.loads(out)["paused_at"] is None
    with stack.client() as c:

        def done() -> dict[str, object] | None:
            body = c.get(f"/runs/{run_id}/result", params={"wait": 5}).json()
            return body if body["done"] else None

        result = wait_for_sync(done, timeout=90, what="run result")
        assert result["status"] == "completed", result
        assert result["output"] == f"pid-{survivor.pid}-attempt-2+finished"
        kinds = [e["kind"] for e in c.get(f"/runs/{run_id}/events").json()["items"]]
    assert kinds.index("run_unpaused") < len(kinds) - 1 - kinds[::-1].index("run_claimed")
    assert (shared / f"{name}.completed").read_text().split() == [str(survivor.pid)]
