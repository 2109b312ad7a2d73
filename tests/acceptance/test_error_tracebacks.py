"""Over real HTTP, a failed run's error shows no path of the worker (docs/adr/0025).

A ``treadle worker`` process runs a step that fails two helpers deep; a client reads the
run, its steps and its dead letter through the API: user frames with relative paths only.
The worker's own log keeps the full traceback (absolute paths, Treadle's frames).
"""

from __future__ import annotations

import re

from tests.acceptance.conftest import ROOT, Stack
from tests.helpers import wait_for_sync

HANDLERS = "tests.acceptance.error_handlers"
HERE = "tests/acceptance/error_handlers.py"
FRAME = re.compile(r'^  File "([^"]*)", line \d+, in (\S+)$', re.MULTILINE)


def test_a_failed_runs_error_shows_no_worker_path(stack: Stack) -> None:
    worker = stack.start_worker(HANDLERS)
    worker_log = stack.logs[-1]
    with stack.client() as c:
        made = c.post("/runs", json={"workflow": "acc-error", "input": {"order_id": "A-17"}})
        assert made.status_code == 201, made.text
        run_id = made.json()["run_id"]

        def failed() -> dict[str, object] | None:
            run: dict[str, object] = c.get(f"/runs/{run_id}").json()
            return run if run["status"] == "failed" else None

        run = wait_for_sync(failed, timeout=90, what=f"run {run_id} failed")
        body = c.get(f"/runs/{run_id}").text
        steps_body = c.get(f"/runs/{run_id}/steps").text
        (step,) = c.get(f"/runs/{run_id}/steps").json()["items"]
        letters = c.get("/dead-letters").text
        report = c.get(f"/runs/{run_id}/report", params={"format": "text"}).text
    error = run["error"]
    assert isinstance(error, dict), run
    assert error["type"] == "StepFailed" and error["step_id"] == "charge", error
    # The report names the run's claims apart from the step's attempts, in human units.
    assert "claims       1 (executions: times a worker took the run)" in report, report
    assert re.search(r"^duration     \S+ (ms|s|min) .*\(created to finished\)$", report, re.M)
    assert re.search(r" charge +failed +attempt 1/1  \d+(\.\d)? m?s ", report), report
    for shown in (body, steps_body, letters, report):
        # Neither the checkout's absolute path nor Treadle's own files.
        assert str(ROOT) not in shown, shown
        assert "app/engine" not in shown and "asyncio" not in shown, shown
    step_frames = FRAME.findall(step["error"]["traceback"])
    assert step_frames == [
        (HERE, "charge"),
        (HERE, "load_order"),
        (HERE, "read_order_file"),
        (HERE, "charge"),
    ], step["error"]["traceback"]
    # The user's message is the user's: its absolute path stays.
    assert "no such file: /srv/orders/A-17.json" in step["error"]["traceback"]
    assert error["message"].endswith("RuntimeError: order A-17 cannot be charged"), error

    # The operator's copy: the worker's log has every frame, with absolute paths.
    worker.terminate()
    worker.wait(timeout=30)
    log = worker_log.read_text()
    assert "step error recorded" in log, log[-3000:]
    assert f"{ROOT}/tests/acceptance/error_handlers.py" in log, log[-3000:]
    assert f"{ROOT}/app/engine/executor.py" in log, log[-3000:]
