"""``app.core.heap.settle``: what a started process does to its garbage collector.

Run in a child interpreter: freezing this test process's objects would keep them for the
rest of the session.
"""

from __future__ import annotations

import json
import subprocess
import sys

from app.core import heap

CHILD = """
import gc, json
from app.core import heap
import app.worker.worker  # a started worker's imports
before = gc.get_freeze_count()
heap.settle()
frozen = gc.get_freeze_count()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after start-up
del a, b
print(json.dumps({
    "before": before, "frozen": frozen, "threshold": gc.get_threshold(),
    "collected_after": gc.collect(),
}))
"""


def test_settle_freezes_the_started_heap_and_still_collects_new_cycles() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(out.stdout)
    assert got["before"] == 0
    # Every module, class and function of a worker's imports: many thousands.
    assert got["frozen"] > 10_000
    assert got["threshold"][0] == heap.YOUNG_THRESHOLD
    assert got["collected_after"] >= 2  # the two nodes of the new cycle
