"""``make bench``: every benchmark in one invocation against one PostgreSQL server.

Usage::

    uv run python -m benchmarks.bench            # the full run (tens of minutes)
    uv run python -m benchmarks.bench --quick    # small N, one repetition (~5 minutes)

In order: engine throughput of Treadle and DBOS Transact side by side (two workloads,
each worker count, repetitions interleaved so drift on the machine hits both alike,
medians reported) with pgqueuer's bare-queue floor beside the one-step runs (same N
no-op jobs, same worker process counts and per-worker concurrency), the pgbench limit
of our checkpoint SQL, latency (the half-load rate is half Treadle's measured one-step
peak with one worker, the latency benchmark's one), HTTP ``POST /runs`` beside a bare
FastAPI INSERT at 16 and at 64 connections, and the scale curve with worker memory.
Each measurement uses its own fresh database, dropped afterwards. Prints a table, writes
``benchmarks/results/bench-<stamp>.json``
(and ``bench-latest.json``) and draws PNG charts (:mod:`benchmarks.charts`): into
``docs/benchmarks/`` on a full run, ``benchmarks/results/charts/`` with ``--quick``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import (
    charts,
    http_api,
    latency,
    peer,
    pglimit,
    scale,
    submit_batch,
    throughput,
)
from benchmarks.common import RESULTS, ROOT, median

# Many submitters: the second HTTP load, beside the 16 connections of the first.
MANY_CONNECTIONS = 64
# Two clients keep one batch in flight while the server parses the next: more only queue.
BATCH_CONNECTIONS = 2


def _machine() -> dict[str, Any]:
    pg = subprocess.run(
        [pglimit.pgbench_path(), "--version"], capture_output=True, text=True
    ).stdout.strip()
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "pgbench": pg,
        "loadavg_at_start": [round(x, 2) for x in load],
        "dbos": peer.DBOS_VERSION,
        "pgqueuer": peer.PGQUEUER_VERSION,
    }


def _throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    workloads = [(args.runs_one, 1), (args.runs_ten, 10)]
    samples: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for rep in range(args.repeats):
        for n_runs, n_steps in workloads:
            for w in args.workers:
                engines = ["treadle"] if args.skip_peer else ["treadle", "dbos"]
                if n_steps == 1 and not (args.skip_peer or args.skip_floor):
                    engines.append("pgqueuer")  # the floor: a job is one no-op step
                for engine in engines:
                    t0 = time.monotonic()
                    if engine == "treadle":
                        r = throughput.measure(n_runs, n_steps, w, args.concurrency)
                    elif engine == "dbos":
                        r = peer.measure(n_runs, n_steps, w, args.concurrency)
                    else:
                        r = peer.measure_pgqueuer(n_runs, w, args.concurrency)
                    samples.setdefault((engine, n_steps, w), []).append(r)
                    print(
                        f"  [{rep + 1}/{args.repeats}] {engine:<8} {n_steps:>2}-step W={w}: "
                        f"{r['steps_per_second']:>8} steps/s ({time.monotonic() - t0:.0f} s)",
                        flush=True,
                    )
    rows = []
    for (engine, n_steps, w), rs in samples.items():
        rows.append(
            {
                "engine": engine,
                "steps_per_run": n_steps,
                "runs": rs[0]["runs"],
                "workers": w,
                "concurrency": args.concurrency,
                "steps_per_second": median([r["steps_per_second"] for r in rs]),
                "runs_per_second": median([r["runs_per_second"] for r in rs]),
                "worker_cpu_ms_per_step": median([r["worker_cpu_ms_per_step"] for r in rs]),
                "samples_steps_per_second": [r["steps_per_second"] for r in rs],
            }
        )
    return rows


def floor_ratio(rows: list[dict[str, Any]], row: dict[str, Any]) -> float | None:
    """``row``'s steps/s over pgqueuer's jobs/s at the same worker count (one-step rows).

    None when ``row`` is not a one-step row or pgqueuer was not measured at its ``W``.
    The ``vs pgqueuer`` column of the table and ``treadle_over_pgqueuer_*`` in the ratios.
    """
    if row["steps_per_run"] != 1:
        return None
    for r in rows:
        if r["engine"] == "pgqueuer" and r["workers"] == row["workers"] and r["steps_per_second"]:
            return round(float(row["steps_per_second"]) / float(r["steps_per_second"]), 3)
    return None


def _best(rows: list[dict[str, Any]], engine: str, n_steps: int) -> dict[str, Any] | None:
    mine = [r for r in rows if r["engine"] == engine and r["steps_per_run"] == n_steps]
    return max(mine, key=lambda r: r["steps_per_second"]) if mine else None


def _ratios(result: dict[str, Any]) -> dict[str, Any]:
    rows = result["throughput"]
    out: dict[str, Any] = {}
    for n_steps in (1, 10):
        ours, theirs = _best(rows, "treadle", n_steps), _best(rows, "dbos", n_steps)
        if ours and theirs:
            out[f"treadle_over_dbos_{n_steps}_step"] = round(
                ours["steps_per_second"] / theirs["steps_per_second"], 3
            )
            mine = [r for r in rows if r["steps_per_run"] == n_steps]
            cpu = {
                e: min(r["worker_cpu_ms_per_step"] for r in mine if r["engine"] == e)
                for e in ("treadle", "dbos")
            }
            if cpu["dbos"]:
                out[f"cpu_per_step_treadle_over_dbos_{n_steps}_step"] = round(
                    cpu["treadle"] / cpu["dbos"], 3
                )
    for r in rows:
        ratio = floor_ratio(rows, r) if r["engine"] == "treadle" else None
        if ratio is not None:
            out[f"treadle_over_pgqueuer_1_step_w{r['workers']}"] = ratio
    ours, floor = _best(rows, "treadle", 1), _best(rows, "pgqueuer", 1)
    if ours and floor:
        out["treadle_over_pgqueuer_1_step"] = round(
            ours["steps_per_second"] / floor["steps_per_second"], 3
        )
    pg = result.get("pglimit") or []
    best10 = _best(rows, "treadle", 10)
    if pg and best10:
        for script in ("executor_step", "checkpoint"):
            limits = [p["steps_per_second"] for p in pg if p["script"] == script]
            if limits:
                out[f"treadle_over_pgbench_{script}"] = round(
                    best10["steps_per_second"] / max(limits), 3
                )
    if "http" in result:
        out["post_runs_over_bare_insert"] = result["http"]["ratio"]
    if "http_many" in result:
        out[f"post_runs_over_bare_insert_{MANY_CONNECTIONS}_connections"] = result["http_many"][
            "ratio"
        ]
    for b in (result.get("batch") or {}).get("results", []):
        out[f"post_runs_batch_{b['batch_size']}_runs_per_second"] = b["runs_per_second"]
    curve = result.get("scale") or []
    if len(curve) > 1:
        out["claim_throughput_largest_over_smallest"] = round(
            curve[-1]["steps_per_second"] / curve[0]["steps_per_second"], 3
        )
    return out


def _print(result: dict[str, Any]) -> None:
    print("\nEngine throughput (median of", result["params"]["repeats"], "runs)")
    print(
        f"{'engine':<8} {'steps/run':>9} {'runs':>6} {'W':>3} {'steps/s':>9} {'runs/s':>8} "
        f"{'worker CPU ms/step':>18} {'vs pgqueuer':>11}"
    )
    rows = result["throughput"]
    for r in sorted(rows, key=lambda r: (r["steps_per_run"], r["workers"], r["engine"])):
        ratio = floor_ratio(rows, r)
        print(
            f"{r['engine']:<8} {r['steps_per_run']:>9} {r['runs']:>6} {r['workers']:>3} "
            f"{r['steps_per_second']:>9.1f} {r['runs_per_second']:>8.1f} "
            f"{r['worker_cpu_ms_per_step']:>18.2f} "
            f"{'' if ratio is None else f'{ratio:.3f}':>11}"
        )
    if any(r["engine"] == "pgqueuer" for r in rows):
        print("(vs pgqueuer: steps/s over pgqueuer's no-op jobs/s at the same W; pgqueuer = 1)")
    if result.get("pglimit"):
        print("\npgbench with our checkpoint SQL (steps/s)")
        for p in result["pglimit"]:
            print(f"{p['script']:<14} clients={p['clients']:>3} {p['steps_per_second']:>9.1f}")
    if result.get("latency"):
        lat = result["latency"]
        rate = lat["half_load"]["rate_runs_per_second"]
        print(f"\nLatency (ms, database clock; 50% load = {rate} runs/s, one worker)")
        print(f"{'':<33} {'p50':>8} {'p95':>8} {'p99':>8}")
        for label, part in (
            ("idle: submit -> first step", lat["idle"]["first_step"]),
            ("idle: submit -> completed", lat["idle"]["completed"]),
            ("50% load: submit -> first step", lat["half_load"]["first_step"]),
            ("50% load: submit -> completed", lat["half_load"]["completed"]),
            ("50% load, warm-up: -> first step", lat["half_load"]["warmup"]["first_step"]),
            ("signal wake-up lateness", lat["signal"]["lateness"]),
            ("timer wake-up lateness", lat["timer"]["lateness"]),
        ):
            print(f"{label:<33} {part['p50_ms']:>8} {part['p95_ms']:>8} {part['p99_ms']:>8}")
    for key in ("http", "http_many"):
        if not result.get(key):
            continue
        h = result[key]
        print(f"\nHTTP POST /runs ({h['treadle']['generator']}, {h['connections']} connections)")
        for side in ("treadle", "bare"):
            s = h[side]
            print(
                f"{side:<8} {s['requests_per_second']:>8} req/s  p50 {s['p50_ms']} ms  "
                f"p99 {s['p99_ms']} ms  non-2xx {s['non_2xx']}"
            )
    if result.get("batch"):
        b = result["batch"]
        print(f"\nHTTP POST /runs:batch ({b['connections']} connections, median of {b['repeats']})")
        for r in b["results"]:
            print(
                f"{r['batch_size']:>5} runs/request {r['runs_per_second']:>9} runs/s  "
                f"samples {r['samples']}  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms  "
                f"server CPU {r['server_cpu_us_per_run']} us/run  "
                f"{'FLAGGED' if r['flagged'] else 'ok'}"
            )
    if result.get("scale"):
        print("\nScale: claim throughput vs finished rows in runs")
        for s in result["scale"]:
            print(
                f"{s['finished_rows']:>9} finished rows: {s['steps_per_second']:>8} steps/s, "
                f"claim p99 {s['claim_p99_ms']} ms, list p99 {s['list_p99_ms']} ms"
            )
    if result.get("memory"):
        m = result["memory"]
        print(
            f"\nMemory: one worker {m['rss_idle_mib']} MiB idle, {m['rss_after_mib']} MiB after "
            f"{m['waiting_runs']} runs wait on timers ({m['per_run_kib']} KiB/run)"
        )
    print("\nRatios")
    for k, v in result["ratios"].items():
        print(f"  {k}: {v}")


def main() -> None:
    """Parse arguments, run everything, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description="Treadle benchmarks (make bench)")
    parser.add_argument("--quick", action="store_true", help="small N, one repetition")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--runs-one", type=int, default=None, help="one-step runs (2000)")
    parser.add_argument("--runs-ten", type=int, default=None, help="ten-step runs (500)")
    parser.add_argument("--workers", type=int, nargs="+", default=None)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--skip-peer", action="store_true", help="Treadle alone, no DBOS and no pgqueuer"
    )
    parser.add_argument(
        "--skip-floor", action="store_true", help="no pgqueuer floor beside the one-step runs"
    )
    parser.add_argument(
        "--charts-dir",
        default=None,
        help="where the PNG charts go (default docs/benchmarks; quick: benchmarks/results/charts)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        choices=["throughput", "pglimit", "latency", "http", "scale"],
    )
    parser.add_argument(
        "--scale-rows",
        type=int,
        nargs="+",
        default=None,
        help="finished-row counts for the scale curve (default 10k 100k 1M; quick: 10k)",
    )
    args = parser.parse_args()
    quick = args.quick
    args.repeats = args.repeats or (1 if quick else 3)
    args.runs_one = args.runs_one or (100 if quick else 2000)
    args.runs_ten = args.runs_ten or (20 if quick else 500)
    args.workers = args.workers or ([1, 2] if quick else [1, 2, 4])
    parts = set(args.only or ["throughput", "pglimit", "latency", "http", "scale"])
    scale_rows = args.scale_rows or ([10_000] if quick else [10_000, 100_000, 1_000_000])
    seconds = 3.0 if quick else 10.0

    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "started_at": started.isoformat(),
        "machine": _machine(),
        "params": {
            "quick": quick,
            "repeats": args.repeats,
            "runs_one_step": args.runs_one,
            "runs_ten_step": args.runs_ten,
            "workers": args.workers,
            "concurrency": args.concurrency,
            "poll_interval_seconds": float(throughput.POLL_SECONDS),
        },
        "throughput": [],
    }
    if "throughput" in parts:
        if not args.skip_peer:
            peer.peer_python()  # install DBOS and pgqueuer before anything is timed
        print("throughput (Treadle, DBOS and the pgqueuer floor, interleaved):", flush=True)
        result["throughput"] = _throughput(args)
    if "pglimit" in parts:
        print("pgbench limit ...", flush=True)
        result["pglimit"] = pglimit.measure([1, 4, 8, 16], seconds)
    if "latency" in parts:
        # The latency benchmark runs one worker: half load is half of one worker's peak.
        one = [r for r in result["throughput"] if r["workers"] == 1]
        best = _best(one, "treadle", 1) or _best(result["throughput"], "treadle", 1)
        peak = best["runs_per_second"] if best else 50.0
        print(f"latency (half load = {peak / 2:.1f} runs/s) ...", flush=True)
        result["latency"] = latency.measure(20 if quick else 200, peak, seconds)
    if "http" in parts:
        print("HTTP ...", flush=True)
        result["http"] = http_api.measure(seconds, 16)
        print(f"HTTP, {MANY_CONNECTIONS} connections ...", flush=True)
        result["http_many"] = http_api.measure(seconds, MANY_CONNECTIONS)
        print("HTTP POST /runs:batch ...", flush=True)
        result["batch"] = submit_batch.measure(
            seconds, BATCH_CONNECTIONS, [100, 1000], repeats=args.repeats
        )
    if "scale" in parts:
        print("scale curve ...", flush=True)
        result["scale"] = scale.measure(scale_rows, 40 if quick else 2000)
        result["memory"] = scale.memory(100 if quick else 1000)
    result["ratios"] = _ratios(result)
    result["finished_at"] = datetime.now(UTC).isoformat()
    _print(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps(result, indent=2)
    (RESULTS / f"bench-{stamp}.json").write_text(text)
    (RESULTS / "bench-latest.json").write_text(text)
    print(f"\nwrote benchmarks/results/bench-{stamp}.json")
    default_dir = RESULTS / "charts" if quick else ROOT / "docs" / "benchmarks"
    written = charts.draw(result, Path(args.charts_dir) if args.charts_dir else default_dir)
    for path in written:
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
