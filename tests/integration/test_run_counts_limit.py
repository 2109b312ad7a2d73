"""``GET /runs/counts`` counts each status up to ``TREADLE_RUN_COUNT_LIMIT`` (both databases).

Below the limit the counts are exact; at it the status reports the limit, is named in
``at_least`` and ``total_at_least`` is true, whichever way the count is computed (a
narrow label counted exactly from its index, broad filters walked per status).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import insert

from app.api.app import create_app
from app.auth.dev import DevTokens
from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import run_labels, runs
from tests.conftest import DEV_SECRET, make_settings

LIMIT = 5
# (status, runs, of which labelled region=eu, of which labelled customer=vip)
SEED = (("completed", 9, 7, 2), ("failed", 5, 5, 0), ("queued", 2, 1, 1), ("running", 6, 0, 0))


@pytest.fixture
async def api(db: Database, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The API in-process (ASGI) with a count limit of 5."""
    settings = make_settings(db.url, tmp_path, run_count_limit=LIMIT)
    app = create_app(settings, db=db, check_schema_on_start=False)
    token = DevTokens(DEV_SECRET).mint(tenant_id="acme", subject="op", scopes=("runs:read",))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://treadle",
        headers={"Authorization": f"Bearer {token}"},
    ) as client:
        yield client


async def _seed(db: Database) -> None:
    now = await db.now()
    run_rows, label_rows = [], []
    for status, n, eu, vip in SEED:
        for i in range(n):
            rid = uuid.uuid4()
            labels = {"region": "eu" if i < eu else "us"}
            if i < vip:
                labels["customer"] = "vip"
            run_rows.append(
                {
                    "run_id": rid,
                    "tenant_id": "acme",
                    "workflow": "wf",
                    "version": "1",
                    "status": status,
                    "input": "{}",
                    "created_by": "seed",
                    "created_at": now - timedelta(minutes=i),
                    "updated_at": now,
                    "labels": json.dumps(labels),
                }
            )
            label_rows += [
                {"run_id": rid, "tenant_id": "acme", "key": k, "value": v}
                for k, v in labels.items()
            ]
    # Another tenant's runs never count.
    run_rows.append({**run_rows[0], "run_id": uuid.uuid4(), "tenant_id": "globex"})
    async with db.write() as conn:
        await conn.execute(insert(runs), run_rows)
        await conn.execute(insert(run_labels), label_rows)


async def test_counts_stop_at_the_limit_and_say_so(db: Database, api: httpx.AsyncClient) -> None:
    await _seed(db)

    every = (await api.get("/runs/counts")).json()
    assert every["count_limit"] == LIMIT
    assert every["counts"]["completed"] == LIMIT and every["counts"]["running"] == LIMIT
    assert (every["counts"]["failed"], every["counts"]["queued"]) == (5, 2)
    assert every["at_least"] == ["running", "completed"]  # status order
    assert every["total_at_least"] is True
    assert every["total"] == LIMIT + LIMIT + 5 + 2

    # A broad label (more than the limit carry it): walked per status, capped.
    eu = (await api.get("/runs/counts", params={"label.region": "eu"})).json()
    assert (eu["counts"]["completed"], eu["counts"]["failed"], eu["counts"]["queued"]) == (5, 5, 1)
    assert eu["at_least"] == ["completed"] and eu["total_at_least"] is True
    prefix = (await api.get("/runs/counts", params={"label.region": "e*"})).json()
    assert prefix == eu

    # A narrow label (at most the limit carry it): exact, nothing capped.
    vip = (await api.get("/runs/counts", params={"label.customer": "vip"})).json()
    assert (vip["counts"]["completed"], vip["counts"]["queued"], vip["total"]) == (2, 1, 3)
    assert (vip["at_least"], vip["total_at_least"]) == ([], False)

    # Broad label and another broad filter: still per status, exact below the limit.
    both = (await api.get("/runs/counts", params={"label.region": "us", "workflow": "wf"})).json()
    assert both["counts"]["running"] == LIMIT and both["at_least"] == ["running"]
    assert (both["counts"]["completed"], both["counts"]["queued"]) == (2, 1)


@pytest.mark.parametrize("bad", [0, -1, 100_000_001])
def test_count_limit_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(ValidationError, match="run_count_limit"):
        Settings(dev_secret=DEV_SECRET, run_count_limit=bad)
