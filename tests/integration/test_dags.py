"""Typed DAGs on both databases: parallel nodes, examples and the steps listing.

Covers independent nodes overlapping in time, the order-total example's results, and a
DAG run's nodes listed through ``GET /runs/{id}/steps`` with status and reason filters.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import BaseModel
from sqlalchemy import select

import examples.order_total as order_total_example
from app.api.app import create_app
from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import steps
from app.engine.registry import Registry
from app.sdk import RetryPolicy, flow, join
from tests.conftest import DEV_SECRET
from tests.integration.support import reach, submit, workers

TENANT = "dags"
gates: dict[str, asyncio.Event] = {}


def gate(name: str) -> asyncio.Event:
    return gates.setdefault(name, asyncio.Event())


class Key(BaseModel):
    key: str


async def begin(k: Key) -> str:
    return k.key


async def left(key: str) -> str:
    # Each branch waits until the other has started: they can only both finish if the
    # engine runs them at the same time (a sequential engine times out here and fails).
    gate(f"{key}:left").set()
    await asyncio.wait_for(gate(f"{key}:right").wait(), 10)
    return "L"


async def right(key: str) -> str:
    gate(f"{key}:right").set()
    await asyncio.wait_for(gate(f"{key}:left").wait(), 10)
    return "R"


async def pair(a: str, b: str) -> list[str]:
    return [a, b]


once = RetryPolicy(max_attempts=1)
_begun = flow("dag-parallel", begin)
parallel_dag = join(_begun.then(left, retry=once), _begun.then(right, retry=once)).then(pair)


async def count(k: Key) -> int:
    return len(k.key)


async def plus_one(n: int) -> int:
    return n + 1


async def plus_two(n: int) -> int:
    return n + 2


async def plus_three(n: int) -> int:
    return n + 3


async def refuse(a: int, b: int, c: int) -> int:
    raise ConnectionError(f"ledger unavailable for {a + b + c}")


_counted = flow("dag-listing", count)
listing_dag = join(
    _counted.then(plus_one), _counted.then(plus_two), _counted.then(plus_three)
).then(refuse, retry=RetryPolicy(max_attempts=2, backoff="fixed", delay=0.01))

REGISTRY = Registry(
    [parallel_dag.definition, listing_dag.definition, order_total_example.order_total.definition]
)


@contextlib.asynccontextmanager
async def api(
    settings: Settings, db: Database, tenant: str = TENANT
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, db=db, check_schema_on_start=False)
    tok = DevTokens(DEV_SECRET).mint(tenant_id=tenant, subject="t", scopes=ALL_SCOPES)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://test",
        headers={"Authorization": f"Bearer {tok}"},
    ) as client:
        yield client


async def test_independent_nodes_run_in_parallel(settings: Settings, db: Database) -> None:
    key = f"p-{uuid.uuid4().hex[:8]}"
    run_id = await submit(db, settings, REGISTRY, TENANT, "dag-parallel", key=key)
    async with workers(settings, db, REGISTRY):
        row = await reach(db, TENANT, run_id, "completed", "failed")
    assert (row["status"], row["output"]) == ("completed", '["L","R"]')
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(steps.c.step_id, steps.c.seq, steps.c.started_at, steps.c.finished_at)
                .where(steps.c.run_id == run_id)
                .order_by(steps.c.seq)
            )
        ).all()
    assert [(r.step_id, r.seq) for r in rows] == [
        ("begin", 0),
        ("left", 1),
        ("right", 2),
        ("pair", 3),
    ]
    by_id = {r.step_id: r for r in rows}
    # That the branches ran at the same time is proved by their gates (each returns only
    # once the other has started), not by the journal's times: a step's ``started_at`` is
    # the worker's estimate of the database clock, late by up to the claim's round trip
    # (ADR 0040), and a held result's ``finished_at`` is its write's time (ADR 0047), so
    # two overlapping attempts of a few milliseconds can show disjoint intervals. What
    # the journal does promise: each interval is well formed, both start after their
    # parent finished, and the join starts after both.
    for branch in ("left", "right"):
        assert by_id[branch].started_at <= by_id[branch].finished_at
    assert by_id["begin"].finished_at <= min(by_id["left"].started_at, by_id["right"].started_at)
    assert by_id["pair"].started_at >= max(by_id["left"].finished_at, by_id["right"].finished_at)


async def test_order_total_example(settings: Settings, db: Database) -> None:
    expected = {
        "ORD-1001": (3399, 599),
        "ORD-1002": (6299, 1699),
        "ORD-1003": (13496, 0),
    }
    runs = {
        oid: await submit(db, settings, REGISTRY, TENANT, "order-total", order_id=oid)
        for oid in [*expected, "ORD-404"]
    }
    async with workers(settings, db, REGISTRY), api(settings, db) as client:
        for oid, (subtotal, shipping) in expected.items():
            await reach(db, TENANT, runs[oid], "completed")
            result = (await client.get(f"/runs/{runs[oid]}/result")).json()
            assert result["output"] == {
                "order_id": oid,
                "subtotal_cents": subtotal,
                "shipping_cents": shipping,
                "total_cents": subtotal + shipping,
            }
        missing = await reach(db, TENANT, runs["ORD-404"], "failed")
        assert missing["reason"] == "failure_non_retryable"
        listed = (await client.get(f"/runs/{runs['ORD-1002']}/steps")).json()["items"]
        assert [(s["step_id"], s["status"], s["reason"]) for s in listed] == [
            ("load_order", "succeeded", "succeeded"),
            ("price_items", "succeeded", "succeeded"),
            ("price_shipping", "succeeded", "succeeded"),
            ("add", "succeeded", "succeeded"),
        ]


async def _pages(client: httpx.AsyncClient, path: str, **params: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    token: str | None = None
    while True:
        query = {**params, **({"page_token": token} if token else {})}
        resp = await client.get(path, params=query)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        pages.append([s["step_id"] for s in body["items"]])
        token = body["next_page_token"]
        if token is None:
            return pages


async def test_steps_listing_filters_and_pages(settings: Settings, db: Database) -> None:
    run_id = await submit(db, settings, REGISTRY, TENANT, "dag-listing", key="abcd")
    async with workers(settings, db, REGISTRY):
        row = await reach(db, TENANT, run_id, "completed", "failed")
    assert (row["status"], row["reason"]) == ("failed", "failure_attempts_exhausted")
    path = f"/runs/{run_id}/steps"
    async with api(settings, db) as client:
        everything = (await client.get(path)).json()["items"]
        assert [(s["step_id"], s["status"], s["reason"], s["attempt"]) for s in everything] == [
            ("count", "succeeded", "succeeded", 1),
            ("plus_one", "succeeded", "succeeded", 1),
            ("plus_two", "succeeded", "succeeded", 1),
            ("plus_three", "succeeded", "succeeded", 1),
            ("refuse", "failed", "failure_attempts_exhausted", 2),
        ]
        assert await _pages(client, path, status="succeeded", limit=3) == [
            ["count", "plus_one", "plus_two"],
            ["plus_three"],
        ]
        assert await _pages(client, path, reason="succeeded", limit=2) == [
            ["count", "plus_one"],
            ["plus_two", "plus_three"],
        ]
        assert await _pages(client, path, status="failed") == [["refuse"]]
        assert await _pages(client, path, reason="failure_attempts_exhausted") == [["refuse"]]
        assert await _pages(
            client, path, status="succeeded", reason="failure_attempts_exhausted"
        ) == [[]]
        assert await _pages(client, path, reason="canceled_by_request") == [[]]
        # A page token is bound to the filters it was issued for.
        first = (await client.get(path, params={"status": "succeeded", "limit": 1})).json()
        other = await client.get(
            path, params={"status": "failed", "limit": 1, "page_token": first["next_page_token"]}
        )
        assert other.status_code == 400
        assert other.headers["content-type"].startswith("application/problem+json")
        bad = await client.get(path, params={"status": "exploded"})
        assert bad.status_code == 422
        bad = await client.get(path, params={"reason": "because"})
        assert bad.status_code == 422
    # Another tenant sees nothing: 404, as for a missing run.
    async with api(settings, db, tenant="someone-else") as client:
        resp = await client.get(path, params={"status": "succeeded"})
        assert resp.status_code == 404
