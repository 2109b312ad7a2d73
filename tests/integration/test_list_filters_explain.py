"""Every ``GET /runs`` / ``GET /runs/counts`` filter combination is served by an index.

PostgreSQL only (SQLite's planner is not what a large deployment runs). The test loads
``TREADLE_EXPLAIN_ROWS`` runs (default 200,000: enough that the planner prefers indexes
over reading ``runs``; the issue's bar is 1,000,000) with ``generate_series``, half of
them one tenant's and the rest in 50 others, two labels each, VACUUM ANALYZEs, then asks
``EXPLAIN (FORMAT JSON)`` for the list and the counts query (the very statements the API
runs, from app/db/queries/run_filters.py) under every combination of up to three
filters, plus all of them at once, and asserts no plan node is a ``Seq Scan`` of
``runs`` or ``run_labels``.

At 1,000,000 runs (docs/benchmarks.md records the timings)::

    TREADLE_EXPLAIN_ROWS=1000000 uv run pytest -q -s \
        tests/integration/test_list_filters_explain.py -k postgresql
"""

from __future__ import annotations

import itertools
import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import ClauseElement, Executable, text
from sqlalchemy.ext.compiler import compiles

from app.core.labels import LabelFilter
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries.run_filters import RunListFilters, count_statement, list_statement

ROWS = int(os.environ.get("TREADLE_EXPLAIN_ROWS", "200000"))
TENANTS = 50
# Half the runs are one tenant's (a big customer, or a single-tenant deployment): its
# filters cannot lean on the tenant's share of the rows being small.
TENANT = "big"

# One value per filter, chosen to match some rows of TENANT (as an operator's would).
NOW = datetime.now(UTC)
FILTERS: dict[str, dict[str, Any]] = {
    "workflow": {"workflow": "wf3"},
    "status": {"status": "completed"},
    "reason": {"reason": "failure_timed_out"},
    "version": {"version": "v2"},
    "created": {"created_after": NOW - timedelta(days=3), "created_before": NOW},
    "finished": {"finished_after": NOW - timedelta(days=2), "finished_before": NOW},
    "idempotency_key": {"idempotency_key": "key-12345"},
    "waiting_on": {"waiting_kind": "signal", "waiting_name": "payment"},
    "waiting_kind": {"waiting_kind": "signal"},
    "label": {"labels": (LabelFilter("customer", "42"),)},
    "label_prefix": {"labels": (LabelFilter("customer", "42", prefix=True),)},
    "two_labels": {"labels": (LabelFilter("customer", "42"), LabelFilter("region", "eu-west"))},
}


class Explain(Executable, ClauseElement):
    """``EXPLAIN (FORMAT JSON) <statement>`` with the statement's own bound parameters."""

    inherit_cache = False

    def __init__(self, statement: Any) -> None:
        self.statement = statement


@compiles(Explain, "postgresql")
def _explain(element: Explain, compiler: Any, **kw: Any) -> str:
    return "EXPLAIN (FORMAT JSON) " + str(compiler.process(element.statement, **kw))


LOAD = """
INSERT INTO runs (run_id, tenant_id, workflow, version, status, reason, input, created_by,
                  access, created_at, updated_at, finished_at, idempotency_key,
                  waiting_kind, waiting_name, labels)
SELECT gen_random_uuid(), CASE WHEN i % 2 = 0 THEN :big ELSE 't' || (i % :tenants) END,
       'wf' || (i % 20), 'v' || (i % 5),
       (ARRAY['completed','failed','cancelled','queued','waiting_signal','running'])[i % 6 + 1],
       CASE i % 6 WHEN 0 THEN 'succeeded' WHEN 1 THEN
         (ARRAY['failure_timed_out', 'failure_non_retryable',
                'failure_attempts_exhausted'])[i % 3 + 1]
         WHEN 2 THEN 'canceled_by_request' END,
       '{}', 'alice', 'tenant',
       now() - (i % 10000) * interval '1 minute', now(),
       CASE WHEN i % 6 < 3 THEN now() - (i % 7000) * interval '1 minute' END,
       'key-' || i,
       CASE WHEN i % 6 = 4 THEN 'signal' END,
       CASE WHEN i % 6 = 4 THEN (ARRAY['payment','shipping','refund'])[i % 3 + 1] END,
       '{"customer": "' || (i % 5000) || '", "region": "eu-west"}'
FROM generate_series(1, :rows) AS i
"""

LOAD_LABELS = """
INSERT INTO run_labels (run_id, tenant_id, key, value)
SELECT run_id, tenant_id, l.key, l.value
FROM runs, jsonb_each_text(runs.labels::jsonb) AS l(key, value)
"""


def _scans(plan: Any) -> list[tuple[str, str]]:
    """(node type, relation) of every plan node that reads a relation."""
    found: list[tuple[str, str]] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        if "Relation Name" in node:
            found.append((node["Node Type"], node["Relation Name"]))
        stack.extend(node.get("Plans", []))
    return found


def _combinations() -> list[tuple[str, ...]]:
    names = list(FILTERS)
    combos: list[tuple[str, ...]] = []
    for size in range(0, 4):
        for combo in itertools.combinations(names, size):
            labels = [n for n in combo if n in ("label", "label_prefix", "two_labels")]
            waits = [n for n in combo if n.startswith("waiting")]
            if len(labels) > 1 or len(waits) > 1:
                continue  # the same parameter twice: not a request the API accepts
            combos.append(combo)
    every = tuple(n for n in names if n not in ("label", "label_prefix", "waiting_kind"))
    combos.append(every)
    return combos


@pytest.mark.slow
@pytest.mark.timeout(7200)
async def test_list_filters_use_indexes(settings: Settings, db: Database) -> None:
    if db.dialect != "postgresql":
        pytest.skip("the plans checked are PostgreSQL's")
    t0 = time.perf_counter()
    async with db.write() as conn:
        # A million rows take longer than the service's per-statement ceiling.
        await conn.execute(text("SET LOCAL statement_timeout = 0"))
        await conn.execute(text(LOAD), {"rows": ROWS, "tenants": TENANTS, "big": TENANT})
        await conn.execute(text(LOAD_LABELS))
    loaded = time.perf_counter() - t0
    async with db.autocommit() as conn:
        await conn.execute(text("SET statement_timeout = 0"))
        await conn.execute(text("VACUUM ANALYZE runs"))
        await conn.execute(text("VACUUM ANALYZE run_labels"))
    analyzed = time.perf_counter() - t0 - loaded
    bad: list[str] = []
    combos = _combinations()
    t1 = time.perf_counter()
    async with db.read() as conn:
        for combo in combos:
            values: dict[str, Any] = {}
            for name in combo:
                values.update(FILTERS[name])
            filters = RunListFilters(**values)
            statements = (
                ("list", list_statement(TENANT, filters, before_run_id=None, limit=51)),
                ("count", count_statement(TENANT, filters, limit=10_000)),
                (
                    "list as owner",
                    list_statement(TENANT, filters, before_run_id=None, limit=51, owner="bob"),
                ),
            )
            for what, stmt in statements:
                if what == "count" and combo == ("status",):
                    continue  # counts ignore status
                plan = (await conn.execute(Explain(stmt))).scalar_one()
                doc = plan if isinstance(plan, list) else json.loads(plan)
                for node, rel in _scans(doc[0]["Plan"]):
                    if node == "Seq Scan":
                        bad.append(f"{what} {combo}: Seq Scan on {rel}")
    explained = time.perf_counter() - t1
    print(
        f"\nEXPLAIN at {ROWS:,} runs: load {loaded:.1f} s, vacuum analyze {analyzed:.1f} s, "
        f"{len(combos)} combinations x 3 statements explained in {explained:.1f} s"
    )
    assert not bad, "\n".join(bad[:50])
