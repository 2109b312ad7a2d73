"""Queue controls over real HTTP with two worker processes, on both databases.

``acc-limited`` declares ``concurrency_limit=2``: however much capacity the two workers
have (8 each), no more than two of its steps overlap in database time. ``acc-metered``
declares 5 starts a second: consecutive first starts are at least 200 ms apart. Both are
shown by ``GET /workflows``; ``priority`` round-trips through ``POST /runs``.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

import httpx

from tests.acceptance.conftest import Stack
from tests.helpers import wait_for_sync

HANDLERS = "tests.acceptance.queue_handlers"


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _finish(c: httpx.Client, run_ids: list[str]) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        rows = [c.get(f"/runs/{r}").json() for r in run_ids]
        return rows if all(row["status"] == "completed" for row in rows) else None

    return wait_for_sync(done, timeout=90, interval=0.2, what="every run completed")


def _peak_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    # Ends sort before starts at the same instant (-1 < 1): touching is not overlapping.
    return max(itertools.accumulate(d for _, d in edges))


def test_global_limit_and_rate_limit_across_two_worker_processes(stack: Stack) -> None:
    stack.start_worker(handlers=HANDLERS)
    stack.start_worker(handlers=HANDLERS)
    with stack.client() as c:
        versions = {w["name"]: w["versions"][0] for w in c.get("/workflows").json()["items"]}
        assert versions["acc-limited"]["queue_controls"]["concurrency_limit"] == 2
        assert versions["acc-metered"]["queue_controls"]["rate_limit"] == {
            "per_second": 5.0,
            "burst": 1,
            "by": "workflow",
        }
        limited = [
            c.post(
                "/runs",
                json={"workflow": "acc-limited", "input": {"seconds": 0.3}, "priority": i},
            ).json()["run_id"]
            for i in range(8)
        ]
        metered = [
            c.post("/runs", json={"workflow": "acc-metered", "input": {}}).json()["run_id"]
            for _ in range(6)
        ]
        _finish(c, limited)
        spans = []
        for run_id in limited:
            (step,) = c.get(f"/runs/{run_id}/steps").json()["items"]
            spans.append((_at(step["started_at"]), _at(step["finished_at"])))
        assert _peak_overlap(spans) == 2, spans

        starts = sorted(_at(row["started_at"]) for row in _finish(c, metered))
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
        assert min(gaps) >= 0.199, gaps
        assert {c.get(f"/runs/{r}").json()["priority"] for r in limited} == set(range(8))
