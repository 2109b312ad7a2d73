"""The chaos harness, bounded for CI.

60 runs, a worker killed every second, and the database chaos monkey restarting
PostgreSQL every 2-4 s (down 0-1 s, crash and clean alternately) until at least three
restarts are done; ``benchmarks/chaos.py`` runs thousands by hand with restarts every
5-40 s.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from benchmarks.chaos import PG_BIN
from tests.acceptance.conftest import ROOT


@pytest.mark.skipif(not (PG_BIN / "initdb").exists(), reason="PostgreSQL binaries not found")
@pytest.mark.timeout(420)
def test_chaos_harness_invariants_hold() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.chaos",
            "--runs",
            "60",
            "--kill-every",
            "1",
            "--pg-restart-every",
            "2:4",
            "--pg-down",
            "0:1",
            "--min-restarts",
            "3",
            "--timeout",
            "300",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert "FAIL" not in result.stdout
    restarts = re.search(
        r"^ok   PostgreSQL restarts by the monkey \S.*?(\d+) \((\d+) / (\d+)\)$",
        result.stdout,
        re.M,
    )
    assert restarts is not None, result.stdout
    total, crashes, clean = map(int, restarts.groups())
    assert total >= 3 and crashes >= 1 and clean >= 1, result.stdout
    assert re.search(r"^ok   500 answers +0$", result.stdout, re.M), result.stdout
