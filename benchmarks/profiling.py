"""Profile the hot paths with py-spy: a worker draining ten-step runs, or ``POST /runs``.

Usage::

    uv run python -m benchmarks.profiling --runs 300 --seconds 20
    uv run python -m benchmarks.profiling --api --seconds 10

Worker (default): starts one ``treadle worker`` (concurrency 16) on a fresh database
holding ``--runs`` pre-submitted ten-step runs. ``--api``: starts ``treadle serve`` as
the HTTP benchmark does (:mod:`benchmarks.http_api`) and keeps it busy with the same load
generator (``wrk``, 16 connections, or its httpx fallback). Either process is sampled
with ``py-spy record`` twice for ``--seconds`` (idle threads excluded, so the samples are
where the CPU goes), and the results go to ``benchmarks/results/``:

- ``profile-<worker|api>.svg``: the flame graph;
- ``profile-<worker|api>.txt``: the functions with the largest share of samples (project
  code, SQLAlchemy, asyncpg, pydantic, self time), then the 200 most sampled collapsed
  stacks (``py-spy --format raw``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import asyncpg

from app.db.migrations import upgrade_to_head
from benchmarks import http_api
from benchmarks.common import RESULTS, asyncpg_url, fresh_database, start_workers, stop
from benchmarks.throughput import POLL_SECONDS, POOL_SIZE, prepare


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy not found: `uv sync` installs it (dev group)")
    return found


def summarize(raw: str, top: int = 25) -> str:
    """Rank frames by the share of samples whose stack contains them (inclusive)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # Frames are "func (file:line)": rank functions, not lines.
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        if frames[-1].startswith("_worker (concurrent/futures/thread.py"):
            continue  # an idle to_thread pool thread blocked in queue.get
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    if not total:
        return "no samples\n"

    def table(title: str, counter: collections.Counter[str], keep: str = "") -> list[str]:
        rows = [(f, n) for f, n in counter.most_common() if keep in f][:top]
        return [title] + [f"{100 * n / total:6.1f}%  {f}" for f, n in rows] + [""]

    lines = [f"{total} samples"]
    lines += table("inclusive, project code (app/):", inclusive, "app/")
    lines += table("inclusive, SQLAlchemy:", inclusive, "sqlalchemy/")
    lines += table("inclusive, asyncpg:", inclusive, "asyncpg/")
    lines += table("inclusive, pydantic:", inclusive, "pydantic")
    lines += table("self time, all frames:", own)
    return "\n".join(lines) + "\n"


def _until_claiming(url: str, timeout: float = 60) -> None:
    """Wait until the worker has claimed a run, so start-up (imports) is not sampled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if asyncio.run(_running(url)):
            return
        time.sleep(0.05)
    raise TimeoutError("the worker claimed nothing")


async def _running(url: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval("SELECT count(*) FROM runs WHERE started_at IS NOT NULL"))
    finally:
        await conn.close()


def _record(pid: int, seconds: float, name: str) -> Path:
    """Sample ``pid`` twice (collapsed stacks, then a flame graph); write the summary."""
    base = [_py_spy(), "record", "--pid", str(pid), "--duration", str(int(seconds))]
    raw_path = RESULTS / f"profile-{name}.raw"
    # Back to back on the same steady load: collapsed stacks for the summary, then
    # py-spy's own flame graph.
    for fmt, out in (("raw", raw_path), ("flamegraph", RESULTS / f"profile-{name}.svg")):
        subprocess.run([*base, "--format", fmt, "-o", str(out)], check=True, capture_output=True)
    raw = raw_path.read_text()
    raw_path.unlink()
    stacks = sorted(raw.splitlines(), key=lambda line: -int(line.rpartition(" ")[2] or 0))
    txt = RESULTS / f"profile-{name}.txt"
    txt.write_text(
        summarize(raw) + "\nthe 200 most sampled collapsed stacks:\n" + "\n".join(stacks[:200])
    )
    return txt


def profile(n_runs: int, seconds: float) -> Path:
    """Record a worker draining ten-step runs; returns the summary file."""
    with fresh_database("prof") as url:
        upgrade_to_head(asyncpg_url(url))
        asyncio.run(prepare(url, n_runs, 10))
        [worker] = start_workers(
            url, 1, 16, TREADLE_POLL_INTERVAL_SECONDS=POLL_SECONDS, TREADLE_DB_POOL_SIZE=POOL_SIZE
        )
        try:
            _until_claiming(url)
            return _record(worker.pid, seconds, "worker")
        finally:
            stop([worker])


def profile_api(seconds: float) -> Path:
    """Record ``treadle serve`` answering ``POST /runs`` under load; returns the summary."""
    # Twice the sampling time of load: both recordings see a steady server.
    with http_api.serving_treadle() as (port, token, pid):
        load = threading.Thread(
            target=http_api.load,
            args=(f"http://127.0.0.1:{port}/runs", token, 2 * seconds + 2, 16),
        )
        load.start()
        try:
            return _record(pid, seconds, "api")
        finally:
            load.join()


def main() -> None:
    """Parse arguments, profile, print the summary head."""
    parser = argparse.ArgumentParser(description="py-spy profile of a worker or the API")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--api", action="store_true", help="profile POST /runs instead")
    args = parser.parse_args()
    txt = profile_api(args.seconds) if args.api else profile(args.runs, args.seconds)
    print("\n".join(txt.read_text().splitlines()[:60]))


if __name__ == "__main__":
    main()
