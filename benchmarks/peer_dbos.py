"""The DBOS Transact side of the side-by-side benchmark (runs in the peer's own venv).

``benchmarks/.peer-venv`` holds ``dbos`` at the version pinned in ``benchmarks/peer.py``,
apart from our dependencies; this module is executed there as a subprocess, never imported
by Treadle. It mirrors ``benchmarks/workloads.py``: a workflow of ``steps`` sequential
no-op steps.

Usage (driven by :mod:`benchmarks.peer`)::

    python benchmarks/peer_dbos.py enqueue URL N STEPS   # launch, register queue, enqueue N
    python benchmarks/peer_dbos.py worker URL ID CONC POLL  # dequeue until SIGTERM

How it is driven, after DBOS's documented queue-worker pattern: one process registers the
queue and enqueues every workflow while listening to no queue (so it executes nothing),
then W worker processes, each with its own ``executor_id`` (DBOS requires one per process
for ``worker_concurrency``), launch and drain the queue. Completion is counted by the
parent from DBOS's own ``workflow_status`` table.
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from dbos import DBOS, DBOSConfig  # type: ignore[import-not-found,unused-ignore]

QUEUE = "bench"


@DBOS.step()  # type: ignore[untyped-decorator,unused-ignore]
def noop(i: int) -> int:
    """A step that returns at once."""
    return i


@DBOS.workflow()  # type: ignore[untyped-decorator,unused-ignore]
def bench_steps(steps: int) -> int:
    """Run ``steps`` sequential no-op steps."""
    total = 0
    for i in range(steps):
        total += noop(i)
    return total


def _config(url: str, executor_id: str) -> DBOSConfig:
    return {
        "name": "treadle-bench",
        "system_database_url": url,
        "executor_id": executor_id,
        # A fixed version, so the enqueuer's and every worker's workflows match.
        "application_version": "bench",
        "log_level": "WARNING",
        "sys_db_pool_size": 20,  # = Treadle's TREADLE_DB_POOL_SIZE in the benchmark
    }


def enqueue(url: str, n: int, steps: int, poll: float, conc: int) -> None:
    """Create DBOS's schema, register the queue and enqueue ``n`` workflows; execute none."""
    DBOS(config=_config(url, "bench-enqueuer"))
    DBOS.listen_queues([])  # this process only enqueues
    DBOS.launch()
    DBOS.register_queue(
        QUEUE, worker_concurrency=conc, polling_interval_sec=poll, on_conflict="always_update"
    )
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda _: DBOS.enqueue_workflow(QUEUE, bench_steps, steps), range(n)))
    DBOS.destroy()


def worker(url: str, executor_id: str) -> None:
    """Launch a DBOS executor that dequeues from the queue until SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DBOS(config=_config(url, executor_id))
    DBOS.listen_queues([QUEUE])
    DBOS.launch()
    stop.wait()
    DBOS.destroy()


def main() -> None:
    """Dispatch on the first argument (``enqueue`` or ``worker``)."""
    mode, url, *rest = sys.argv[1:]
    if mode == "enqueue":
        enqueue(url, int(rest[0]), int(rest[1]), float(rest[2]), int(rest[3]))
    elif mode == "worker":
        worker(url, rest[0])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
