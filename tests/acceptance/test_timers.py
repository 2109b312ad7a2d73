"""Durable timers over real processes.

A sleep survives its worker's death and fires on database time, never early.
"""

from __future__ import annotations

import signal
from datetime import datetime
from typing import Any

from tests.acceptance.conftest import Stack
from tests.conftest import WITH_PGBOUNCER
from tests.helpers import wait_for_sync

# Every timer above 0 s releases the run (no in-process sleeping), so the wake-up path
# under test is the database one.
RELEASE_ALL = {"TREADLE_INLINE_RETRY_MAX_SECONDS": "0"}


@WITH_PGBOUNCER
def test_sleep_survives_worker_death_and_fires_on_database_time(stack: Stack) -> None:
    doomed = stack.start_worker(extra_env=RELEASE_ALL)
    with stack.client() as c:
        run_id = c.post("/runs", json={"workflow": "acc-sleep", "input": {"seconds": 2}}).json()[
            "run_id"
        ]

        def waiting() -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            return body if body["status"] == "waiting_timer" else None

        run = wait_for_sync(waiting, what="run waiting on its timer")
        assert run["waiting_on"]["kind"] == "timer"
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        stack.start_worker(extra_env=RELEASE_ALL)
        result = wait_for_sync(
            lambda: (b := c.get(f"/runs/{run_id}/result", params={"wait": 5}).json())["done"] and b,
            timeout=60,
            what="run finished",
        )
        steps = {s["step_id"]: s for s in c.get(f"/runs/{run_id}/steps").json()["items"]}
        events = c.get(f"/runs/{run_id}/events").json()["items"]
    assert result["status"] == "completed", result
    deadline = datetime.fromisoformat(steps["sleep"]["deadline"])
    fired = next(datetime.fromisoformat(e["at"]) for e in events if e["kind"] == "timer_fired")
    lateness = (fired - deadline).total_seconds()
    assert lateness >= 0, f"timer fired {-lateness:.3f} s early"
    assert float(result["output"]) >= 2.0  # journaled clock readings around the sleep
    print(f"timer lateness after a worker kill: {lateness * 1000:.0f} ms")
