"""PNG charts of one ``make bench`` result: throughput by worker count, latency, scale.

Usage::

    uv run python -m benchmarks.charts benchmarks/results/bench-latest.json docs/benchmarks

:func:`draw` takes the result dict :mod:`benchmarks.bench` writes (the JSON above) and
writes up to three files into a directory: ``throughput.png`` (steps/s against worker
processes, one line per engine and workload, pgqueuer's floor among them),
``latency.png`` (p50/p95/p99 of each latency measurement) and ``scale.png`` (claim
throughput and p99s against finished rows in ``runs``). A part the result lacks (``--only``)
has no chart. matplotlib comes from the ``bench`` dependency group (pyproject.toml), not
from the runtime package; the Agg backend needs no display.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display: before pyplot is imported
import matplotlib.pyplot as plt

_LATENCY_PARTS = (
    ("idle: submit → first step", "idle", "first_step"),
    ("idle: submit → completed", "idle", "completed"),
    ("50% load: submit → first step", "half_load", "first_step"),
    ("50% load: submit → completed", "half_load", "completed"),
    ("signal wake-up lateness", "signal", "lateness"),
    ("timer wake-up lateness", "timer", "lateness"),
)


def _subtitle(result: dict[str, Any]) -> str:
    params = result.get("params", {})
    kind = "quick run" if params.get("quick") else f"median of {params.get('repeats', '?')}"
    return f"{result.get('started_at', '')[:16]} UTC, {kind}, {result['machine']['host']}"


def _throughput(result: dict[str, Any], out: Path) -> Path | None:
    rows = result.get("throughput") or []
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = sorted({(r["engine"], r["steps_per_run"]) for r in rows})
    for engine, steps in series:
        mine = sorted(
            (r for r in rows if r["engine"] == engine and r["steps_per_run"] == steps),
            key=lambda r: r["workers"],
        )
        label = f"{engine}, {steps}-step" if engine != "pgqueuer" else "pgqueuer (no-op jobs)"
        ax.plot(
            [r["workers"] for r in mine],
            [r["steps_per_second"] for r in mine],
            marker="o",
            linestyle="--" if engine == "pgqueuer" else "-",
            label=label,
        )
    ax.set_xlabel("worker processes (W)")
    ax.set_ylabel("steps/s (jobs/s for pgqueuer)")
    ax.set_xticks(sorted({r["workers"] for r in rows}))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"Engine throughput by worker count\n{_subtitle(result)}", fontsize=10)
    return _save(fig, out / "throughput.png")


def _latency(result: dict[str, Any], out: Path) -> Path | None:
    lat = result.get("latency")
    if not lat:
        return None
    # Only the parts this result measured (a partial run leaves some out).
    parts = [(label, part, key) for label, part, key in _LATENCY_PARTS if key in lat.get(part, {})]
    if not parts:
        return None
    labels = [label for label, *_ in parts]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    height = 0.25
    for i, q in enumerate(("p50_ms", "p95_ms", "p99_ms")):
        values = [float(lat[part][key][q]) for _, part, key in parts]
        ax.barh([y + (i - 1) * height for y in range(len(labels))], values, height, label=q[:3])
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms (database clock)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend()
    ax.set_title(f"Latency percentiles\n{_subtitle(result)}", fontsize=10)
    return _save(fig, out / "latency.png")


def _scale(result: dict[str, Any], out: Path) -> Path | None:
    curve = result.get("scale") or []
    if not curve:
        return None
    rows = [s["finished_rows"] for s in curve]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(rows, [s["steps_per_second"] for s in curve], marker="o", color="C0")
    ax.set_xscale("log")
    ax.set_xlabel("finished rows in runs")
    ax.set_ylabel("claim throughput (steps/s)", color="C0")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    right = ax.twinx()
    right.plot(rows, [s["claim_p99_ms"] for s in curve], marker="s", color="C1", label="claim p99")
    right.plot(rows, [s["list_p99_ms"] for s in curve], marker="^", color="C2", label="list p99")
    right.set_ylabel("p99 (ms)")
    right.set_ylim(bottom=0)
    right.legend(loc="lower left")
    ax.set_title(f"Scale curve\n{_subtitle(result)}", fontsize=10)
    return _save(fig, out / "scale.png")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw(result: dict[str, Any], out: Path) -> list[Path]:
    """Write the charts of ``result`` (a ``make bench`` result dict) into ``out``.

    Creates ``out`` if needed; returns the paths written (a part missing from the result
    is skipped, so the list may be shorter than three).
    """
    out.mkdir(parents=True, exist_ok=True)
    drawn = (_throughput(result, out), _latency(result, out), _scale(result, out))
    return [p for p in drawn if p is not None]


def main() -> None:
    """Draw the charts of a saved result JSON into a directory."""
    parser = argparse.ArgumentParser(description="Charts of a make bench result")
    parser.add_argument("result", type=Path, help="benchmarks/results/bench-*.json")
    parser.add_argument("out", type=Path, help="directory for the PNG files")
    args = parser.parse_args()
    for path in draw(json.loads(args.result.read_text()), args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
