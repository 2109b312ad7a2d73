"""The chaos harness, bounded for CI.

60 runs, a worker killed every second, one PostgreSQL restart; ``benchmarks/chaos.py``
runs thousands by hand.
"""

from __future__ import annotations

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
    assert "ok   PostgreSQL restarts " in result.stdout
