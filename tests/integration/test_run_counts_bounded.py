"""``GET /runs/counts`` stays a bounded index read on a million runs (ADR 0020).

PostgreSQL only (the plans checked are PostgreSQL's). One million runs, half of them one
tenant's, loaded once with ``generate_series``; a label on half of that tenant's runs is
the case that took 1.2 s when the count read every match (issue 34). The count statement
of app/db/queries/run_filters.py counts each status up to ``TREADLE_RUN_COUNT_LIMIT`` + 1,
so ``EXPLAIN (ANALYZE)`` must show no sequential scan, every scan of ``runs`` and
``run_labels`` returning a bounded number of rows, and exact answers below the limit.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import func, select, text

from app.core.labels import LabelFilter
from app.core.settings import Settings
from app.core.status import RunStatus
from app.db.database import Database
from app.db.queries.run_filters import RunListFilters, count_listed_by_status, list_filters
from app.db.tables import runs

ROWS = int(os.environ.get("TREADLE_COUNT_ROWS", "1000000"))
TENANT = "big"
LIMIT = Settings.model_fields["run_count_limit"].default

# Run ids are UUIDv7s minted in insertion order, as app.core.ids mints them (one
# millisecond apart here): index order is then roughly heap order, as in a real database.
LOAD = """
INSERT INTO runs (run_id, tenant_id, workflow, version, status, reason, input, created_by,
                  access, created_at, updated_at, labels)
SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - :rows + i), 12, '0')
        || '7' || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid,
       CASE WHEN i % 2 = 0 THEN :big ELSE 't' || (i % 50) END,
       'wf' || (i % 20), 'v1',
       (ARRAY['completed','failed','cancelled','queued','waiting_signal','running'])[i % 6 + 1],
       NULL, '{}', 'alice', 'tenant', now() - (i % 10000) * interval '1 minute', now(),
       '{"region": "' || CASE WHEN i % 4 = 0 THEN 'eu-west' ELSE 'us-east' END
       || '", "customer": "' || (i % 5000) || '"}'
FROM generate_series(1, :rows) AS i
"""

# Only the big tenant's labels: the others' would only lengthen the load.
LOAD_LABELS = """
INSERT INTO run_labels (run_id, tenant_id, key, value)
SELECT run_id, tenant_id, l.key, l.value
FROM runs, jsonb_each_text(runs.labels::jsonb) AS l(key, value)
WHERE runs.tenant_id = :big
"""

CASES: dict[str, RunListFilters] = {
    "unfiltered": RunListFilters(),
    "label on half the tenant": RunListFilters(labels=(LabelFilter("region", "eu-west"),)),
    "label prefix on half the tenant": RunListFilters(
        labels=(LabelFilter("region", "eu", prefix=True),)
    ),
    "rare label": RunListFilters(labels=(LabelFilter("customer", "42"),)),
    "label and workflow": RunListFilters(
        workflow="wf4", labels=(LabelFilter("region", "eu-west"),)
    ),
}
# A broad label with a column filter: the planner reads the column's index range whole (a
# bitmap scan), bounded by that range, not by the limit (docs/adr/0055, consequences).
UNBOUNDED = {"label and workflow"}


def _scans(plan: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(node type, relation, rows it returned over all its loops) of each relation scan."""
    found: list[tuple[str, str, int]] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        if "Relation Name" in node:
            rows = int(node["Actual Rows"]) * int(node.get("Actual Loops", 1))
            found.append((node["Node Type"], node["Relation Name"], rows))
        stack.extend(node.get("Plans", []))
        stack.extend(node.get("InitPlan", []))
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_counts_are_bounded_index_reads_at_a_million_runs(db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("the plans checked are PostgreSQL's")
    t0 = time.perf_counter()
    async with db.write() as conn:
        await conn.execute(text("SET LOCAL statement_timeout = 0"))
        # Loading into fourteen live indexes is what makes a million rows slow: drop the
        # plain indexes of runs, load, and create them again (the same definitions).
        indexes = (
            await conn.execute(
                text(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'runs' "
                    "AND indexname NOT IN (SELECT conname FROM pg_constraint)"
                )
            )
        ).all()
        for name, _ in indexes:
            await conn.execute(text(f'DROP INDEX "{name}"'))
        await conn.execute(text(LOAD), {"rows": ROWS, "big": TENANT})
        await conn.execute(text(LOAD_LABELS), {"big": TENANT})
        for _, definition in indexes:
            await conn.execute(text(definition))
    async with db.autocommit() as conn:
        await conn.execute(text("SET statement_timeout = 0"))
        await conn.execute(text("VACUUM ANALYZE runs"))
        await conn.execute(text("VACUUM ANALYZE run_labels"))
    loaded = time.perf_counter() - t0

    # Every walk stops at LIMIT + 1 matching runs; it reads past that only the runs the
    # other filters reject on the way (half of them here), and a label probe per run.
    budget = len(RunStatus) * (LIMIT + 1) * 4
    report: list[str] = []
    bad: list[str] = []
    # The statements the count runs, captured as sent, then explained as sent.
    sent: list[tuple[str, Any]] = []
    for name, filters in CASES.items():
        sent.clear()

        def capture(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _m: bool) -> None:
            if not statement.startswith("EXPLAIN"):
                sent.append((statement, params))

        sa_event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
        try:
            async with db.read() as conn:
                got = await count_listed_by_status(conn, TENANT, filters, limit=LIMIT)
        finally:
            sa_event.remove(db.engine.sync_engine, "before_cursor_execute", capture)
        read = 0
        started = time.perf_counter()
        async with db.read() as conn:
            for statement, params in sent:
                plan = (
                    await conn.exec_driver_sql(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params
                    )
                ).scalar_one()
                doc = plan if isinstance(plan, list) else json.loads(plan)
                scans = _scans(doc[0]["Plan"])
                read += sum(rows for _, rel, rows in scans if rel in ("runs", "run_labels"))
                bad += [f"{name}: {node} on {rel}" for node, rel, _ in scans if node == "Seq Scan"]
            took = time.perf_counter() - started
            report.append(
                f"{name}: {len(sent)} statements, {read:,} rows read, {took * 1000:.0f} ms"
            )
            if read > budget and name not in UNBOUNDED:
                bad.append(f"{name}: {read:,} rows read, more than {budget:,}")

            # The answer: exact below the limit, "at least" at it.
            exact_stmt = (
                select(runs.c.status, func.count())
                .where(*list_filters(TENANT, filters, status=False))
                .group_by(runs.c.status)
            )
            exact = {str(s): int(n) for s, n in (await conn.execute(exact_stmt)).all()}
        for status in RunStatus:
            n = exact.get(status.value, 0)
            if n > LIMIT:
                assert status.value in got.at_least, (name, status)
                assert got.counts[status.value] == LIMIT
            else:
                assert status.value not in got.at_least, (name, status)
                assert got.counts[status.value] == n, (name, status)
    print(f"\ncounts at {ROWS:,} runs (load {loaded:.1f} s):\n  " + "\n  ".join(report))
    assert not bad, "\n".join(bad)
