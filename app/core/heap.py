"""The garbage collector of a long-running Treadle process, set once it has started.

CPython's cyclic collector walks every tracked object of the generation it collects, and a
full (oldest-generation) collection walks them all: in a started worker that is every
module, class, function and SQLAlchemy construct imported at start-up, hundreds of
thousands of objects that live as long as the process. Measured in one worker draining
15,000 one-step runs (4 Dec 2026, ``gc.callbacks`` timing each collection): 14 full
collections took 0.81 s of its 7.5 s of CPU (11 %), all collections 1.19 s (16 %)
(docs/benchmarks.md, "4 Dec 2026").

:func:`settle` is the standard remedy (the ``gc.freeze`` documentation; Instagram's
"Dismissing Python Garbage Collection at Instagram"): once a process has finished
starting, collect once, then move every surviving object to the permanent generation,
which collections skip; and let more allocations happen between young collections.
Cycles made afterwards are still collected as before.

Called by ``treadle worker`` once it has registered (before its first claim) and by
``treadle serve`` once uvicorn has started: the processes that run for days. Not by
library code (``create_app``, ``Worker``), which tests build and drop by the hundred in one
process: what is frozen there is never freed (docs/adr/0046-settled-heap.md).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 7_000
"""Allocations (minus deallocations) of tracked objects between young collections.

CPython's default is 700; ten times it cut the worker's time in young and middle
collections, together with the freeze, from 0.57 s to 0.37 s per 15,000 one-step runs
(same measurement). The older generations keep CPython's own thresholds."""


def settle() -> None:
    """Collect once, freeze what survived start-up, raise the young threshold (see module).

    A second call in one process freezes only what was made since the first.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
