"""A bounded smoke test of the benchmark harness (``make bench``), so it cannot rot.

Runs the real pieces with tiny sizes: the pgbench scripts against the current schema (a
migration that breaks our checkpoint SQL breaks this test) and a Treadle drain by a real
worker process. The figures themselves are not judged here: docs/benchmarks.md is.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from benchmarks import charts, footprint, peer, pglimit, throughput
from benchmarks.chaos import PG_BIN, Cluster
from benchmarks.common import percentile
from benchmarks.profiling import summarize

pytestmark = pytest.mark.timeout(90)


@pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench not installed")
def test_pgbench_scripts_write_what_the_executor_writes() -> None:
    results = pglimit.measure([2], 1)
    assert {r["script"] for r in results} == {"executor_step", "checkpoint"}
    assert all(r["steps_per_second"] > 0 for r in results)


@pytest.mark.timeout(300)  # the first call builds the peer venv (DBOS, pgqueuer) with uv
def test_pgqueuer_floor_drains_every_job_with_real_consumers() -> None:
    r = peer.measure_pgqueuer(n_jobs=6, n_workers=1, concurrency=4)
    assert r["engine"] == "pgqueuer"
    assert r["runs"] == 6
    assert r["steps_per_second"] > 0


def test_charts_draw_every_part_of_a_result(tmp_path: Path) -> None:
    row = {"steps_per_run": 1, "workers": 1, "steps_per_second": 100.0}
    result = {
        "started_at": "2026-12-02T12:00:00",
        "machine": {"host": "test"},
        "params": {"quick": True},
        "throughput": [
            {**row, "engine": engine, "workers": w, "steps_per_second": 100.0 * w}
            for engine in ("treadle", "dbos", "pgqueuer")
            for w in (1, 2)
        ],
        "latency": {
            "idle": {"first_step": {"n": 3, "p50_ms": 5.0, "p95_ms": 9.0, "p99_ms": 12.0}},
            "timer": {"lateness": {"n": 3, "p50_ms": 40.0, "p95_ms": 60.0, "p99_ms": 70.0}},
        },
        "scale": [
            {"finished_rows": n, "steps_per_second": 200.0, "claim_p99_ms": 1.5, "list_p99_ms": 1.0}
            for n in (1000, 10000)
        ],
    }
    written = charts.draw(result, tmp_path)
    assert sorted(p.name for p in written) == ["latency.png", "scale.png", "throughput.png"]
    for path in written:
        assert path.read_bytes().startswith(b"\x89PNG")
    # A result without a part draws the others.
    assert [p.name for p in charts.draw({**result, "scale": []}, tmp_path / "s")] == [
        "throughput.png",
        "latency.png",
    ]


def test_throughput_drains_every_run_with_a_real_worker() -> None:
    r = throughput.measure(n_runs=6, n_steps=2, n_workers=1, concurrency=4)
    assert r["runs"] == 6
    assert r["steps_per_second"] > 0
    assert r["worker_cpu_ms_per_step"] > 0


@pytest.mark.skipif(not (PG_BIN / "initdb").exists(), reason="PostgreSQL binaries not found")
def test_footprint_counts_a_drain_on_its_own_cluster() -> None:
    # Not pytest's tmp_path: its parent is private to root, and the cluster runs as postgres.
    with tempfile.TemporaryDirectory(prefix="treadle-footprint-") as tmp:
        cluster = Cluster(Path(tmp))
        cluster.init()
        cluster.start()
        try:
            r = footprint.measure(cluster, n_runs=5, n_steps=2)
        finally:
            cluster.stop()
    assert r["rows_per_run"]["runs"] == 1.0
    assert r["rows_per_run"]["steps"] == 2.0
    # A step commits at least its result; the drain's figure can only be larger.
    assert r["drain_commits_per_step"] >= 1
    assert r["drain_wal_bytes_per_step"] > 0
    # Not the peak connections: five runs can drain between two 0.2 s samples.


def test_percentile_and_profile_summary() -> None:
    assert percentile([], 0.99) == 0.0
    assert percentile([5.0], 0.5) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == pytest.approx(99.0, abs=0.1)
    raw = "main (app/cli/main.py:1);step (app/engine/executor.py:9) 3\nmain (app/cli/main.py:2) 1\n"
    text = summarize(raw)
    assert text.startswith("4 samples")
    assert "75.0%  step (app/engine/executor.py)" in text
