"""Helpers shared by the benchmarks: fresh databases, worker processes, percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# The tests' server setting is honoured too, so the harness smoke test runs where they do.
SERVER = os.environ.get(
    "TREADLE_BENCH_PG", os.environ.get("TREADLE_TEST_PG", "postgres@127.0.0.1:5432")
)
DEV_SECRET = "b" * 32


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(f"postgresql://{SERVER}/postgres")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def admin(sql: str) -> None:
    """Run one statement on the server's ``postgres`` database (CREATE/DROP DATABASE)."""
    asyncio.run(_admin(sql))


@contextlib.contextmanager
def fresh_database(tag: str) -> Iterator[str]:
    """Create an empty database for one measurement; drop it afterwards.

    Yields the libpq URL (``postgresql://…``); callers add a driver where they need one.
    The name carries the pid and a random suffix so concurrent benchmarks never collide.
    """
    name = f"treadle_bench_{tag}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://{SERVER}/{name}"
    finally:
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def asyncpg_url(url: str) -> str:
    """The SQLAlchemy URL of a libpq URL (``postgresql+asyncpg://``)."""
    return url.replace("postgresql://", "postgresql+asyncpg://", 1)


def worker_env(url: str, **extra: str) -> dict[str, str]:
    """Environment of a benchmark ``treadle worker`` / ``treadle serve`` subprocess."""
    return {
        **os.environ,
        "TREADLE_DATABASE_URL": asyncpg_url(url),
        # Explicit: the benchmarks mint dev tokens, and `treadle serve` on PostgreSQL
        # refuses dev auth nobody chose.
        "TREADLE_AUTH_MODE": "dev",
        "TREADLE_DEV_SECRET": DEV_SECRET,
        "TREADLE_LOG_LEVEL": "WARNING",
        **extra,
    }


def start_workers(
    url: str, count: int, concurrency: int, **extra: str
) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` ``treadle worker`` processes running ``benchmarks.workloads``."""
    env = worker_env(url, **extra)
    cmd = [sys.executable, "-m", "app.cli.main", "worker", "--handlers", "benchmarks.workloads"]
    return [
        subprocess.Popen(
            [*cmd, "--concurrency", str(concurrency)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM the processes (graceful drain), then wait; SIGKILL after 30 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0–1) of ``values`` by linear interpolation (0.0 if empty)."""
    if not values:
        return 0.0
    if len(values) == 1:
        return float(values[0])
    cuts = statistics.quantiles(values, n=1000, method="inclusive")
    return float(cuts[min(max(round(q * 1000) - 1, 0), len(cuts) - 1)])


def median(values: Sequence[float]) -> float:
    """The median (0.0 if empty)."""
    return float(statistics.median(values)) if values else 0.0


def cpu_seconds(procs: Sequence[subprocess.Popen[bytes]]) -> float:
    """User + system CPU seconds used so far by the processes (Linux ``/proc``, 0 if gone).

    Measured from outside, the same way for Treadle's and DBOS's workers: the CPU spent
    per step does not depend on how busy the rest of a shared machine is.
    """
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in procs:
        try:
            stat = Path(f"/proc/{p.pid}/stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name; utime and stime are 14 and 15.
        fields = stat.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total
