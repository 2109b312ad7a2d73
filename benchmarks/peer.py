"""DBOS Transact, the peer, on the same workloads, server and machine as Treadle.

Usage::

    uv run python -m benchmarks.peer --runs 2000 --steps 1 --workers 1 2 4

DBOS lives in its own virtual environment (``benchmarks/.peer-venv``, created here with
``uv`` at the pinned version) so its dependencies never touch ours; its side runs as
subprocesses of :mod:`benchmarks.peer_dbos`. For each measurement: a fresh database, one
process that enqueues N workflows of S no-op steps on a DBOS queue, then W worker
processes (``worker_concurrency`` = Treadle's per-worker concurrency, queue polling at
Treadle's benchmark poll interval) drain it. Throughput counts from the first workflow
start to the last completion recorded in DBOS's own ``workflow_status`` table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.common import RESULTS, ROOT, cpu_seconds, fresh_database, stop
from benchmarks.throughput import POLL_SECONDS, figures

DBOS_VERSION = "3.4.0"
PEER_VENV = ROOT / "benchmarks" / ".peer-venv"
PEER_SCRIPT = ROOT / "benchmarks" / "peer_dbos.py"


def peer_python() -> Path:
    """The peer venv's interpreter, creating the venv and installing DBOS if needed."""
    python = PEER_VENV / "bin" / "python"
    probe = [
        str(python),
        "-c",
        f"import dbos, importlib.metadata as m; assert m.version('dbos') == '{DBOS_VERSION}'",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"installing dbos=={DBOS_VERSION} into {PEER_VENV.relative_to(ROOT)}", file=sys.stderr)
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(PEER_VENV)], check=True)
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", str(python), f"dbos=={DBOS_VERSION}"],
        check=True,
    )
    return python


async def _status(url: str) -> tuple[int, float]:
    """(completed workflows, seconds from first start to last completion)."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, min(started_at_epoch_ms) AS first, max(completed_at) AS last"
            " FROM dbos.workflow_status WHERE status = 'SUCCESS' AND name LIKE '%bench_steps'"
        )
    finally:
        await conn.close()
    assert row is not None
    if not row["n"]:
        return 0, 0.0
    return int(row["n"]), (int(row["last"]) - int(row["first"])) / 1000.0


async def _started(url: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM dbos.workflow_status WHERE status <> 'ENQUEUED'"
            )
        )
    finally:
        await conn.close()


def measure(n_runs: int, n_steps: int, n_workers: int, concurrency: int) -> dict[str, Any]:
    """One DBOS measurement on a fresh database; returns the figures.

    Raises:
        TimeoutError: the workflows did not all complete within 30 minutes.
    """
    import asyncio

    python = str(peer_python())
    with fresh_database("dbos") as url:
        subprocess.run(
            [
                python,
                str(PEER_SCRIPT),
                "enqueue",
                url,
                str(n_runs),
                str(n_steps),
                POLL_SECONDS,
                str(concurrency),
            ],
            check=True,
            cwd=ROOT,
        )
        start = time.monotonic()
        procs = [
            subprocess.Popen(
                [python, str(PEER_SCRIPT), "worker", url, f"bench-worker-{i}"],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(n_workers)
        ]
        cpu_at_start: float | None = None
        try:
            while True:
                done, seconds = asyncio.run(_status(url))
                if done >= n_runs:
                    cpu = cpu_seconds(procs) - (cpu_at_start or 0.0)
                    break
                if cpu_at_start is None and asyncio.run(_started(url)):
                    cpu_at_start = cpu_seconds(procs)  # start-up (imports, launch) excluded
                if time.monotonic() - start > 1800:
                    raise TimeoutError("DBOS benchmark did not finish within 30 minutes")
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a DBOS worker process exited early")
                time.sleep(0.05 if cpu_at_start is None else 0.2)
        finally:
            stop(procs)
    return {
        **figures(n_runs, n_steps, n_workers, concurrency, seconds),
        "worker_cpu_ms_per_step": round(cpu * 1000 / (n_runs * n_steps), 2),
        "engine": "dbos",
    }


def main() -> None:
    """Parse arguments, run the DBOS measurements, print and save them."""
    parser = argparse.ArgumentParser(description="DBOS Transact throughput on PostgreSQL")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    results = [measure(args.runs, args.steps, w, args.concurrency) for w in args.workers]
    for r in results:
        print(
            f"dbos workers={r['workers']} runs={r['runs']} steps/run={r['steps_per_run']} "
            f"seconds={r['seconds']} steps/s={r['steps_per_second']}"
        )
    (RESULTS / "peer-dbos.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
