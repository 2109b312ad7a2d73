"""``POST /runs:batch`` runs/s on ``treadle serve`` (PostgreSQL) for batches of 100 and 1,000.

Usage::

    uv run python -m benchmarks.submit_batch --seconds 10 --connections 2

One uvicorn process on 127.0.0.1 against a fresh database (:func:`benchmarks.http_api.
serving_treadle`: the one-step workflow registered, a dev-mode ``runs:write`` token).
``--connections`` closed-loop clients each send batches of ``size`` runs, every run with
its own idempotency key (the keyed path reads twins first), for ``--seconds`` per size.
Prints and saves runs/s (created runs over wall time), the p50/p99 request latency and
the server process's CPU time per created run (user + system, microseconds: the figure
least moved by other load on a shared machine);
any non-207 answer or failed item is counted and flags the result. The issue's bar
(#18) is 5,000 runs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]

from benchmarks.common import RESULTS, percentile
from benchmarks.http_api import serving_treadle

WORKFLOW = "bench-steps"
PLACEHOLDER = "KEYPREFIX"  # 32 hex digits replace it in each request


def _cpu_seconds(pid: int) -> float:
    # The server's own CPU time (user + system): unlike runs/s, not shared with the load
    # generator or with other sessions on the machine.
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def _load(
    url: str, token: str, size: int, seconds: float, connections: int, pid: int
) -> dict[str, Any]:
    created = failed = errors = 0
    latencies: list[float] = []
    statuses: dict[str, int] = {}  # non-207 answers by status code
    answers: list[str] = []  # the first few of their bodies, to say what went wrong
    deadline = time.monotonic() + seconds

    # The body is encoded once per size, with a placeholder where each request's key
    # prefix goes: the load generator shares the machine's cores with the server, so
    # encoding 1,000 runs per request in it would be measured as the server's slowness.
    template = json.dumps(
        {
            "runs": [
                {
                    "workflow": WORKFLOW,
                    "input": {"steps": 1},
                    "idempotency_key": f"{PLACEHOLDER}-{i}",
                }
                for i in range(size)
            ]
        }
    ).encode()

    async def client() -> None:
        nonlocal created, failed, errors
        async with httpx.AsyncClient(
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=120,
        ) as http:
            while time.monotonic() < deadline:
                body = template.replace(PLACEHOLDER.encode(), uuid.uuid4().hex.encode())
                began = time.perf_counter()
                resp = await http.post(url, content=body)
                latencies.append(time.perf_counter() - began)
                if resp.status_code != 207:
                    errors += 1
                    statuses[str(resp.status_code)] = statuses.get(str(resp.status_code), 0) + 1
                    if len(answers) < 3:
                        answers.append(resp.text[:300])
                    continue
                answer = resp.json()
                created += answer["created"]
                failed += answer["failed"]

    cpu_before = _cpu_seconds(pid)
    began = time.monotonic()
    await asyncio.gather(*(client() for _ in range(connections)))
    elapsed = time.monotonic() - began
    cpu = _cpu_seconds(pid) - cpu_before
    return {
        "batch_size": size,
        "requests": len(latencies),
        "runs_created": created,
        "runs_per_second": round(created / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "server_cpu_us_per_run": round(cpu / created * 1e6, 1) if created else None,
        "failed_items": failed,
        "non_207": errors,
        "non_207_statuses": statuses,
        "non_207_answers": answers,
        "flagged": bool(failed or errors),
    }


def measure(seconds: float, connections: int, sizes: list[int], repeats: int = 1) -> dict[str, Any]:
    """runs/s per batch size on one server, ``repeats`` times each (median reported).

    Returns ``{"seconds", "connections", "repeats", "results": [one per size]}``; each
    result is the median sample by runs/s, with every sample's runs/s in ``samples``.
    One fresh database for the whole measurement (:func:`serving_treadle`).
    """
    with serving_treadle() as (port, token, pid):
        url = f"http://127.0.0.1:{port}/runs:batch"
        results = []
        for size in sizes:
            runs = [
                asyncio.run(_load(url, token, size, seconds, connections, pid))
                for _ in range(repeats)
            ]
            runs.sort(key=lambda r: float(r["runs_per_second"]))
            median = dict(runs[len(runs) // 2])
            median["samples"] = [r["runs_per_second"] for r in runs]
            median["flagged"] = any(r["flagged"] for r in runs)
            results.append(median)
    return {
        "seconds": seconds,
        "connections": connections,
        "repeats": repeats,
        "results": results,
    }


def main() -> None:
    """Parse arguments, measure, print and save (benchmarks/results/submit_batch.json)."""
    parser = argparse.ArgumentParser(description="POST /runs:batch runs/s")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    result = measure(args.seconds, args.connections, args.sizes, args.repeats)
    print(json.dumps(result, indent=2))
    (RESULTS / "submit_batch.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
