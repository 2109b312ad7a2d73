"""Per-key limits across real processes: an API and two worker processes, both databases.

``acc-slots`` declares ``key_limit=2, on_limit="queue"``. Six runs of one key: two start,
four wait (``queued``, ``blocked_reason``, counted by ``GET /workflows``) while a run of
another key starts at once. Releasing holders one at a time starts exactly the next run in
submission order; releasing the rest together still never lets more than two steps of
the key overlap. Overlap and order are read from the step and event timestamps the
database wrote, not from wall-clock measurements in the test.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select

from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import events, runs, steps
from tests.acceptance.conftest import Stack
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

KEY = "customer-7"


def _started(stack: Stack, name: str) -> bool:
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    return any(shared.glob(f"{name}.started.*"))


def _release(stack: Stack, name: str) -> None:
    (Path(stack.env["TREADLE_TEST_DIR"]) / f"{name}.release").touch()


def _history(stack: Stack) -> tuple[list[Any], list[str]]:
    """Per run of KEY: (run_id, step started_at, step finished_at); run_admitted order."""

    async def read() -> tuple[list[Any], list[str]]:
        db = Database(Settings(database_url=stack.database_url, dev_secret=DEV_SECRET))
        try:
            async with db.read() as conn:
                spans = (
                    await conn.execute(
                        select(runs.c.run_id, steps.c.started_at, steps.c.finished_at)
                        .join(steps, steps.c.run_id == runs.c.run_id)
                        .where(runs.c.concurrency_key == KEY, steps.c.kind == "step")
                    )
                ).all()
                admitted = (
                    await conn.execute(
                        select(events.c.run_id)
                        .where(events.c.kind == "run_admitted")
                        .order_by(events.c.event_id)
                    )
                ).scalars()
                return list(spans), [str(r) for r in admitted]
        finally:
            await db.dispose()

    return asyncio.run(read())


def test_key_limit_queues_in_order_across_two_workers(stack: Stack) -> None:
    stack.start_worker()
    stack.start_worker()
    tag = uuid.uuid4().hex[:8]
    names = [f"{tag}-{i}" for i in range(6)]
    with stack.client() as c:
        submitted = []
        for name in names:
            r = c.post(
                "/runs",
                json={"workflow": "acc-slots", "input": {"name": name}, "concurrency_key": KEY},
            )
            assert r.status_code == 201, r.text
            submitted.append(r.json())
        ids = [s["run_id"] for s in submitted]
        assert [s["concurrency_slot"] for s in submitted[:2]] == [1, 2]
        for s in submitted[2:]:
            assert (s["status"], s["concurrency_slot"]) == ("queued", None)
            assert f"concurrency key {KEY!r} (key_limit 2)" in s["blocked_reason"]
        wait_for_sync(lambda: all(_started(stack, n) for n in names[:2]), what="two holders")

        # Another key is not held up by the busy one.
        other = c.post(
            "/runs",
            json={"workflow": "acc-slots", "input": {"name": f"{tag}-o"}, "concurrency_key": "o"},
        )
        assert other.json()["concurrency_slot"] == 1
        wait_for_sync(lambda: _started(stack, f"{tag}-o"), what="the other key's run")
        _release(stack, f"{tag}-o")

        waiting = c.get(f"/runs/{ids[2]}").json()
        assert waiting["status"] == "queued" and "key_limit 2" in waiting["blocked_reason"]
        version = next(w for w in c.get("/workflows").json()["items"] if w["name"] == "acc-slots")
        assert version["versions"][0]["queued_for_slot"] == 4
        assert not any(_started(stack, n) for n in names[2:])

        # One holder at a time: exactly the next run in submission order starts.
        _release(stack, names[1])
        wait_for_sync(lambda: _started(stack, names[2]), what="the first waiter")
        _release(stack, names[0])
        wait_for_sync(lambda: _started(stack, names[3]), what="the second waiter")
        assert not any(_started(stack, n) for n in names[4:])
        # Then everything at once: the key still admits two at a time.
        for name in names:
            _release(stack, name)

        def finished() -> bool:
            return all(c.get(f"/runs/{i}").json()["status"] == "completed" for i in ids)

        wait_for_sync(finished, timeout=60, what="all runs of the key completed")

    spans, admitted = _history(stack)
    assert len(spans) == 6
    # Intervals: the most at once is reached at some step's start.
    for _, start, _ in spans:
        at_once = [s for s in spans if s[1] <= start < s[2]]
        assert len(at_once) <= 2, spans
    assert admitted == ids[2:]  # admitted in submission order
    started = {str(run_id): start for run_id, start, _ in spans}
    # The first waiters started after both holders, one after the other.
    assert started[ids[2]] < started[ids[3]] < min(started[i] for i in ids[4:])
    assert max(started[i] for i in ids[:2]) < started[ids[2]]
