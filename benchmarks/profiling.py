"""Profile one worker's hot path with py-spy while it drains ten-step runs.

Usage::

    uv run python -m benchmarks.profiling --runs 300 --seconds 20

Starts one ``treadle worker`` (concurrency 16) on a fresh database holding ``--runs``
pre-submitted ten-step runs, samples it with ``py-spy record`` twice for ``--seconds`` (idle
threads excluded, so the samples are where the CPU goes), and writes to
``benchmarks/results/``:

- ``profile-worker.svg``: the flame graph;
- ``profile-worker.txt``: the functions with the largest share of samples (project code,
  SQLAlchemy, asyncpg, pydantic, self time), then the 200 most sampled collapsed stacks
  (``py-spy --format raw``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

from app.db.migrations import upgrade_to_head
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


def profile(n_runs: int, seconds: float) -> Path:
    """Record the worker; returns the summary file."""
    svg = RESULTS / "profile-worker.svg"
    txt = RESULTS / "profile-worker.txt"
    with fresh_database("prof") as url:
        upgrade_to_head(asyncpg_url(url))
        asyncio.run(prepare(url, n_runs, 10))
        [worker] = start_workers(
            url, 1, 16, TREADLE_POLL_INTERVAL_SECONDS=POLL_SECONDS, TREADLE_DB_POOL_SIZE=POOL_SIZE
        )
        try:
            _until_claiming(url)
            base = [_py_spy(), "record", "--pid", str(worker.pid), "--duration", str(int(seconds))]
            # Back to back on the same steady drain: collapsed stacks for the summary, then
            # py-spy's own flame graph.
            raw_path = RESULTS / "profile-worker.raw"
            for fmt, out in (("raw", raw_path), ("flamegraph", svg)):
                subprocess.run(
                    [*base, "--format", fmt, "-o", str(out)], check=True, capture_output=True
                )
        finally:
            stop([worker])
    raw = raw_path.read_text()
    raw_path.unlink()
    stacks = sorted(raw.splitlines(), key=lambda line: -int(line.rpartition(" ")[2] or 0))
    txt.write_text(
        summarize(raw) + "\nthe 200 most sampled collapsed stacks:\n" + "\n".join(stacks[:200])
    )
    return txt


def main() -> None:
    """Parse arguments, profile, print the summary head."""
    parser = argparse.ArgumentParser(description="py-spy profile of a Treadle worker")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    txt = profile(args.runs, args.seconds)
    print("\n".join(txt.read_text().splitlines()[:60]))


if __name__ == "__main__":
    main()
