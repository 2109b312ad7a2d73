"""``treadle serve`` and ``treadle worker`` started with no database: wait, then one line.

Both processes are pointed at a port with nothing listening. They must retry with
backoff, logging ``database fault at start; retrying`` per attempt, and after
``TREADLE_DB_START_TIMEOUT_SECONDS`` exit 1 with a single line naming the setting and
the error: no traceback, no endless silent retry (docs/operations.md, "Start-up without a
database"). A database that comes back within the wait is waited for
(tests/acceptance/test_db_faults.py, the worker started while the database is down).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.acceptance.conftest import ROOT, cli_run, free_port
from tests.conftest import DEV_SECRET

COMMANDS = {
    "serve": lambda: ["serve", "--port", str(free_port())],
    "worker": lambda: ["worker", "--handlers", "tests.acceptance.handlers"],
}


def _env(tmp_path: Path, wait: str) -> dict[str, str]:
    dead = free_port()  # bound and released: nothing listens there
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")},
        # Written without the async driver, as operators often do: normalized.
        "TREADLE_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{dead}/treadle",
        "TREADLE_DB_START_TIMEOUT_SECONDS": wait,
        "TREADLE_AUTH_MODE": "dev",
        "TREADLE_DEV_SECRET": DEV_SECRET,
        "TREADLE_DATA_DIR": str(tmp_path / "data"),
        "TREADLE_LOG_FORMAT": "json",
        "PYTHONPATH": str(ROOT),
    }


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unreachable_database_is_waited_for_then_one_line_and_exit_1(
    command: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    done = cli_run(_env(tmp_path, "3"), *COMMANDS[command](), timeout=180)
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output, output
    events = [json.loads(line) for line in output.splitlines() if line[:1] == "{"]
    retries = [e for e in events if e["event"] == "database fault at start; retrying"]
    # 0.2 + 0.4 + 0.8 + 1.6 s of backoff fit in 3 s: several attempts, each logged.
    assert len(retries) >= 3, output
    assert {e["what"] for e in retries} == {"schema check"}
    assert {e["fault"] for e in retries} == {"unavailable"}
    last = [line for line in done.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("cannot start: the database stayed unreachable for 3 s "), last
    assert "TREADLE_DB_START_TIMEOUT_SECONDS" in last, last
    assert took >= 3, took  # it did wait


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_zero_wait_tries_once(command: str, tmp_path: Path) -> None:
    done = cli_run(_env(tmp_path, "0"), *COMMANDS[command](), timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "database fault at start; retrying" not in output, output
    assert "Traceback" not in output, output
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("cannot start: the database stayed unreachable for 0 s")
    ), output
