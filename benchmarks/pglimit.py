"""The PostgreSQL limit: pgbench running Treadle's own per-step checkpoint SQL.

Usage::

    uv run python -m benchmarks.pglimit --clients 1 4 8 16 --seconds 10

Two custom pgbench scripts on a freshly migrated database, each client working on its own
``running`` run (as each worker slot does), prepared statements (``-M prepared``, as
asyncpg does):

``executor_step``
    Exactly what the executor commits for one no-op step on PostgreSQL today
    (``app/db/queries/checkpoints.py``): two single-statement transactions, *start*
    (fenced ``UPDATE runs``, ``INSERT … ON CONFLICT`` into ``steps``, ``INSERT`` into
    ``events``, as data-modifying CTEs) and *succeed* (fenced ``UPDATE runs``, ``UPDATE
    steps``, ``INSERT`` into ``events``). One script execution = one step, so pgbench's
    tps is the database's ceiling in steps/s for our current protocol.
``checkpoint``
    The minimal checkpoint transaction of DESIGN §7: the fenced ``UPDATE`` of the run and
    the ``INSERT`` of the finished step, one commit per step. What a one-commit-per-step
    protocol could reach.

Claims, journal loads and run completion are not in either script, so both are ceilings.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from app.db.migrations import upgrade_to_head
from benchmarks.common import RESULTS, asyncpg_url, fresh_database

# Client c works on run 00000000-0000-0000-0000-<c+1>: no two clients touch one run row.
_RUN = "('00000000-0000-0000-0000-' || lpad((:client_id + 1)::text, 12, '0'))::uuid"
_FENCE = f"runs.tenant_id = 'bench' AND runs.run_id = {_RUN} AND runs.fence = 1 AND runs.status IN ('running', 'cancelling', 'compensating')"  # noqa: E501

_HELD = f"""held AS (
  UPDATE runs SET updated_at = now() WHERE {_FENCE}
  RETURNING run_id, tenant_id)"""

# The executor's two single-statement checkpoints (app/db/queries/checkpoints.py), each
# its own transaction (autocommit), with a no-op step's values.
EXECUTOR_STEP = f"""\\set seq :seq + 1
WITH {_HELD},
journal AS (
  INSERT INTO steps (run_id, step_id, tenant_id, seq, kind, name, status, attempt,
    max_attempts, fence, next_attempt_at, detail, created_at, started_at)
  SELECT run_id, 's' || :seq, tenant_id, :seq, 'step', 'noop', 'running', 1, 3, 1, NULL,
    NULL, now(), now() FROM held
  ON CONFLICT (tenant_id, run_id, step_id) DO UPDATE SET status = excluded.status,
    attempt = excluded.attempt, started_at = now(), fence = excluded.fence,
    next_attempt_at = NULL, error = NULL, detail = excluded.detail
  RETURNING run_id, tenant_id),
timeline AS (
  INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
  SELECT run_id, tenant_id, now(), 'step_started', 's' || :seq, NULL,
    '{{"attempt":1,"worker_id":"vm:12345:0123abcd"}}' FROM journal)
SELECT count(*) FROM held;
WITH {_HELD},
journal AS (
  UPDATE steps SET status = 'succeeded', output = '0', error = NULL, fence = 1,
    finished_at = now(), next_attempt_at = NULL
  FROM held WHERE steps.tenant_id = held.tenant_id AND steps.run_id = held.run_id
    AND steps.step_id = 's' || :seq
  RETURNING held.run_id, held.tenant_id),
timeline AS (
  INSERT INTO events (run_id, tenant_id, at, kind, step_id, actor, data)
  SELECT run_id, tenant_id, now(), 'step_succeeded', 's' || :seq, NULL, '{{"attempt":1}}'
  FROM journal)
SELECT count(*) FROM held;
"""

CHECKPOINT = f"""\\set seq :seq + 1
BEGIN;
UPDATE runs SET updated_at = now() WHERE {_FENCE};
INSERT INTO steps (run_id, step_id, tenant_id, seq, kind, name, status, attempt, max_attempts,
  output, created_at, started_at, finished_at, fence)
  VALUES ({_RUN}, 's' || :seq, 'bench', :seq, 'step', 'noop', 'succeeded', 1, 3, '0',
  now(), now(), now(), 1);
COMMIT;
"""

SCRIPTS = {"executor_step": EXECUTOR_STEP, "checkpoint": CHECKPOINT}

_SETUP = """
INSERT INTO runs (run_id, tenant_id, workflow, version, status, input, fence, attempt,
  lease_owner, lease_expires_at, available_at, created_by, created_at, updated_at, started_at)
SELECT ('00000000-0000-0000-0000-' || lpad(c::text, 12, '0'))::uuid, 'bench', 'bench-steps',
  '1', 'running', '{"steps":1}', 1, 1, 'pgbench', now() + interval '1 hour',
  now() + interval '1 hour', 'bench', now(), now(), now()
FROM generate_series(1, 64) AS c
"""


def pgbench_path() -> str:
    """The pgbench binary (on PATH, else PostgreSQL 15's bin directory)."""
    found = shutil.which("pgbench")
    if found:
        return found
    fallback = Path("/usr/lib/postgresql/15/bin/pgbench")
    if fallback.exists():
        return str(fallback)
    raise SystemExit("pgbench not found: install PostgreSQL's client tools")


def _pgbench(url: str, script: Path, clients: int, seconds: float) -> float:
    out = subprocess.run(
        [
            pgbench_path(),
            "-n",
            "-M",
            "prepared",
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(max(int(seconds), 1)),
            "-D",
            "seq=0",
            "-f",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if match is None:
        raise RuntimeError(f"unexpected pgbench output:\n{out}")
    return float(match.group(1))


def _check_written(url: str) -> None:
    """Fail unless the scripts really wrote: every step succeeded under a matching fence.

    The fenced UPDATE matching no row would not be an error to pgbench (zero rows is a
    valid UPDATE), so check that every run row was touched after its setup.
    """
    out = subprocess.run(
        [
            "psql",
            "-qAt",
            "-c",
            "SELECT (SELECT count(*) FROM steps), (SELECT count(*) FROM steps"
            " WHERE status <> 'succeeded'), (SELECT count(*) FROM runs r WHERE"
            " r.updated_at = r.created_at AND EXISTS (SELECT 1 FROM steps s"
            " WHERE s.run_id = r.run_id))",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    written, unfinished, untouched = (int(x) for x in out.split("|"))
    if written == 0 or unfinished or untouched:
        raise RuntimeError(
            f"pgbench script did not write as the executor does: {written} steps, "
            f"{unfinished} not succeeded, {untouched} runs never updated"
        )


def measure(clients: list[int], seconds: float) -> list[dict[str, Any]]:
    """Run each script at each client count on a fresh database; steps/s per case."""
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, body in SCRIPTS.items():
            paths[name] = Path(tmp) / f"{name}.sql"
            paths[name].write_text(body)
        for name, path in paths.items():
            for c in clients:
                with fresh_database("pgbench") as url:
                    upgrade_to_head(asyncpg_url(url))
                    subprocess.run(["psql", "-q", "-c", _SETUP, url], check=True)
                    tps = _pgbench(url, path, c, seconds)
                    _check_written(url)
                results.append({"script": name, "clients": c, "steps_per_second": round(tps, 1)})
    return results


def main() -> None:
    """Parse arguments, run pgbench, print and save the figures."""
    parser = argparse.ArgumentParser(description="pgbench with Treadle's checkpoint SQL")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    results = measure(args.clients, args.seconds)
    for r in results:
        print(f"{r['script']:>14} clients={r['clients']:>3} steps/s={r['steps_per_second']:>9}")
    out = RESULTS / "pglimit.json"
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
