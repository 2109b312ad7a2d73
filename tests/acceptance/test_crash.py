"""Crash safety over real processes: kill -9 mid-step, stale (paused) worker fencing."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from tests.acceptance.conftest import Stack
from tests.helpers import wait_for_sync


def _started(shared: Path, name: str, pid: int | None = None) -> list[Path]:
    return [
        p for p in shared.glob(f"{name}.started.*") if pid is None or p.name.endswith(f".{pid}")
    ]


def _submit(stack: Stack, name: str) -> str:
    with stack.client() as c:
        resp = c.post("/runs", json={"workflow": "acc-hold", "input": {"name": name}})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["run_id"])


def _result(stack: Stack, run_id: str) -> dict[str, object]:
    with stack.client() as c:

        def done() -> dict[str, object] | None:
            body = c.get(f"/runs/{run_id}/result", params={"wait": 5}).json()
            return body if body["done"] else None

        return wait_for_sync(done, timeout=60, what="run result")


def test_kill_9_mid_step_another_worker_finishes(stack: Stack) -> None:
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"k9-{uuid.uuid4().hex[:8]}"
    doomed = stack.start_worker()
    run_id = _submit(stack, name)
    wait_for_sync(lambda: _started(shared, name, doomed.pid), what="step started on worker 1")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    (shared / f"{name}.release").touch()
    survivor = stack.start_worker()
    result = _result(stack, run_id)
    assert result["status"] == "completed", result
    assert result["output"] == f"pid-{survivor.pid}-attempt-2+finished"
    # The killed attempt never completed; the step body completed exactly once.
    assert (shared / f"{name}.completed").read_text().split() == [str(survivor.pid)]
    with stack.client() as c:
        steps = c.get(f"/runs/{run_id}/steps").json()["items"]
        run = c.get(f"/runs/{run_id}").json()
    assert [(s["step_id"], s["status"], s["attempt"]) for s in steps] == [
        ("hold", "succeeded", 2),
        ("finish", "succeeded", 1),
    ]
    assert run["attempt"] == 2  # claimed twice: once per worker


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_paused_stale_worker_cannot_commit(stack: Stack) -> None:
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"stale-{uuid.uuid4().hex[:8]}"
    stale = stack.start_worker()
    run_id = _submit(stack, name)
    wait_for_sync(lambda: _started(shared, name, stale.pid), what="step started on stale worker")
    os.kill(stale.pid, signal.SIGSTOP)  # frozen: no heartbeats, lease expires
    try:
        fresh = stack.start_worker()
        (shared / f"{name}.release").touch()
        result = _result(stack, run_id)
        assert result["status"] == "completed"
        assert result["output"] == f"pid-{fresh.pid}-attempt-2+finished"
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    # Resumed, the stale worker finishes its step body but its checkpoint is fenced out.
    wait_for_sync(
        lambda: len((shared / f"{name}.completed").read_text().split()) == 2,
        what="stale step body to finish",
    )
    log = stack.logs[1]
    wait_for_sync(lambda: "lease lost" in log.read_text(), what="stale worker to report lease lost")
    with stack.client() as c:
        steps = c.get(f"/runs/{run_id}/steps").json()["items"]
        events = c.get(f"/runs/{run_id}/events").json()["items"]
    assert steps[0]["output"] == f"pid-{fresh.pid}-attempt-2"
    succeeded = [e for e in events if e["kind"] == "step_succeeded" and e["step_id"] == "hold"]
    assert len(succeeded) == 1


def _lease_expired(stack: Stack, run_id: str) -> bool:
    """True once the run's lease has expired by the database clock (read directly)."""
    import asyncio

    from sqlalchemy import select

    from app.core.settings import Settings
    from app.db.database import Database, fetch_now
    from app.db.tables import runs
    from tests.conftest import DEV_SECRET

    async def probe() -> bool:
        db = Database(
            Settings(database_url=stack.database_url, dev_secret=DEV_SECRET, data_dir=stack.tmp)
        )
        try:
            async with db.read() as conn:
                now = await fetch_now(conn, db.dialect)
                expires = (
                    await conn.execute(
                        select(runs.c.lease_expires_at).where(runs.c.run_id == uuid.UUID(run_id))
                    )
                ).scalar_one()
        finally:
            await db.dispose()
        return expires is not None and expires < now

    return asyncio.run(probe())


@pytest.mark.timeout(300)  # several interpreters start on a loaded machine
def test_worker_paused_past_its_lease_resumes_without_running_steps_twice(stack: Stack) -> None:
    """SIGSTOP a lone worker mid-step past its lease, SIGCONT it: the run just completes.

    Nobody else could take the run while the worker was frozen; resumed, the worker must
    not claim its own run again (a second execution in the same process would count the
    first one's attempt as lost and, repeated, fail the run ``WorkerLost`` with a dead
    letter). The frozen execution carries on, its checkpoints still hold the fence.
    """
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"pause-{uuid.uuid4().hex[:8]}"
    paused = stack.start_worker()
    run_id = _submit(stack, name)
    wait_for_sync(lambda: _started(shared, name, paused.pid), what="step started")
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        wait_for_sync(lambda: _lease_expired(stack, run_id), timeout=60, what="lease to expire")
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    with stack.client() as c:
        # Resumed, the worker heartbeats again: its lease is renewed, by it, same claim.
        def renewed() -> dict[str, object] | None:
            if _lease_expired(stack, run_id):
                return None
            body: dict[str, object] = c.get(f"/runs/{run_id}").json()
            return body

        run = wait_for_sync(renewed, timeout=60, what="lease renewed after SIGCONT")
        assert run["attempt"] == 1, run
    (shared / f"{name}.release").touch()
    result = _result(stack, run_id)
    assert result["status"] == "completed", result
    assert result["output"] == f"pid-{paused.pid}-attempt-1+finished"
    assert (shared / f"{name}.completed").read_text().split() == [str(paused.pid)]
    assert len(_started(shared, name)) == 1  # the step body started once
    with stack.client() as c:
        steps = c.get(f"/runs/{run_id}/steps").json()["items"]
        run = c.get(f"/runs/{run_id}").json()
        events = c.get(f"/runs/{run_id}/events").json()["items"]
        letters = c.get("/dead-letters").json()["items"]
    assert [(s["step_id"], s["status"], s["attempt"]) for s in steps] == [
        ("hold", "succeeded", 1),
        ("finish", "succeeded", 1),
    ]
    assert run["attempt"] == 1
    assert [e["kind"] for e in events].count("run_claimed") == 1
    assert [d for d in letters if d["run_id"] == run_id] == []
    assert "lease lost" not in stack.logs[1].read_text()
