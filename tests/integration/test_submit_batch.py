"""``POST /runs:batch`` on both databases: per-item results, idempotency, atomicity.

One transaction for the accepted items (docs/api.md, "POST /runs:batch"): failed items
are reported beside them, and a database failure mid-batch writes nothing at all.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from sqlalchemy import func, select

from app.api.app import create_app
from app.api.responses import AsciiJSONResponse
from app.api.schemas import SubmitBatchResponse
from app.auth.dev import DevTokens
from app.auth.principal import Scope
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import submits as submits_q
from app.db.tables import events, run_labels, runs
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest, Submitter
from app.sdk import WorkflowContext, workflow
from tests.conftest import DEV_SECRET
from tests.integration import support

TENANT = "batch"
OTHER = "batch-other"


class Job(BaseModel):
    key: str


@workflow("sb-job")
async def job(ctx: WorkflowContext, job: Job) -> Any:
    return job.key


@workflow("sb-one", key_limit=1)
async def one(ctx: WorkflowContext, job: Job) -> Any:
    return job.key


REGISTRY = Registry([job, one])


async def registered(db: Database) -> None:
    async with db.write() as conn:
        await REGISTRY.register(conn)


async def count(db: Database, table: Any, *where: Any) -> int:
    async with db.read() as conn:
        found = await conn.execute(select(func.count()).select_from(table).where(*where))
        return int(found.scalar_one())


def item(key: str = "k", **extra: Any) -> dict[str, Any]:
    return {"workflow": "sb-job", "input": {"key": key}, **extra}


async def batch(client: httpx.AsyncClient, items: Sequence[Any]) -> list[dict[str, Any]]:
    resp = await client.post("/runs:batch", json={"runs": list(items)})
    assert resp.status_code == 207, resp.text
    body = resp.json()
    results: list[dict[str, Any]] = body["results"]
    assert [r["index"] for r in results] == list(range(len(items)))
    assert body["created"] == sum(r["status"] == 201 for r in results)
    assert body["failed"] == sum(r["status"] >= 400 for r in results)
    return results


async def test_mixed_items_each_get_their_own_status(settings: Settings, db: Database) -> None:
    await registered(db)
    async with support.api_client(settings, db, TENANT) as client:
        results = await batch(
            client,
            [
                item("a"),  # 0: new
                item("b", idempotency_key="dup"),  # 1: new, keyed
                item("b", idempotency_key="dup"),  # 2: same key, same body: 1's run
                item("c", idempotency_key="dup"),  # 3: same key, other body: 409
                {"workflow": "sb-nope", "input": {"key": "x"}},  # 4: unknown workflow
                {"workflow": "sb-job", "input": {"nokey": 1}},  # 5: input schema
                7,  # 6: not an object
                item("d", priority="high"),  # 7: a field of the wrong type
                item("nul\u0000inside"),  # 8: NUL inside the input is just data
                {"workflow": "sb\u0000job", "input": {"key": "x"}},  # 9: NUL in a name
                item("e", labels={"customer": "42"}),  # 10: labelled
                {"workflow": "sb-one", "input": {"key": "x"}, "concurrency_key": "c1"},  # 11
                {"workflow": "sb-one", "input": {"key": "y"}, "concurrency_key": "c1"},  # 12
                item("f", delay=3600),  # 13: delayed (its own INSERT group)
            ],
        )
        statuses = [r["status"] for r in results]
        assert statuses == [201, 201, 200, 409, 404, 422, 422, 422, 201, 422, 201, 201, 409, 201]
        assert results[2]["run"]["run_id"] == results[1]["run"]["run_id"]
        assert results[3]["problem"]["code"] == "idempotency_key_reused"
        assert results[3]["problem"]["run_id"] == results[1]["run"]["run_id"]
        assert results[4]["problem"]["code"] == "workflow_not_found"
        assert results[5]["problem"]["errors"][0]["path"] == "$"
        assert results[6]["problem"]["code"] == "invalid_request"
        assert results[7]["problem"]["errors"][0]["path"] == "body.runs.7.priority"
        assert results[9]["problem"]["code"] == "invalid_request"
        assert results[12]["problem"]["code"] == "concurrency_key_busy"
        assert results[12]["problem"]["active_run_id"] == results[11]["run"]["run_id"]
        for r in results:
            assert (r["run"] is None) == (r["status"] >= 400)
            assert (r["problem"] is None) == (r["status"] < 400)
            if r["problem"] is not None:
                assert r["problem"]["status"] == r["status"]
                assert r["problem"]["type"] == f"urn:treadle:problem:{r['problem']['code']}"

        nul = await client.get(f"/runs/{results[8]['run']['run_id']}")
        assert nul.json()["input"] == {"key": "nul\u0000inside"}
        labelled = await client.get("/runs", params={"label.customer": "42"})
        assert [r["run_id"] for r in labelled.json()["items"]] == [results[10]["run"]["run_id"]]
        assert results[11]["run"]["concurrency_slot"] == 1
        assert results[13]["run"]["status"] == "queued"

    created = {r["run"]["run_id"] for r in results if r["status"] == 201}
    assert await count(db, runs, runs.c.tenant_id == TENANT) == len(created) == 6
    # One run_submitted event per new run, none for the replay.
    assert await count(db, events, events.c.kind == "run_submitted") == 6
    assert await count(db, run_labels, run_labels.c.tenant_id == TENANT) == 1


async def test_idempotency_against_stored_runs_and_tenants(
    settings: Settings, db: Database
) -> None:
    await registered(db)
    async with (
        support.api_client(settings, db, TENANT) as client,
        support.api_client(settings, db, OTHER) as other,
    ):
        single = await client.post("/runs", json=item("a", idempotency_key="K"))
        assert single.status_code == 201, single.text
        results = await batch(
            client, [item("a", idempotency_key="K"), item("z", idempotency_key="K2")]
        )
        assert [r["status"] for r in results] == [200, 201]
        assert results[0]["run"]["run_id"] == single.json()["run_id"]
        # Another tenant's key is not visible: the same key is a new run there.
        theirs = await batch(other, [item("a", idempotency_key="K")])
        assert theirs[0]["status"] == 201
        assert theirs[0]["run"]["run_id"] != single.json()["run_id"]
        # A different body under a stored key is 409, without aborting its neighbour.
        clash = await batch(client, [item("b", idempotency_key="K"), item("c")])
        assert [r["status"] for r in clash] == [409, 201]
        assert clash[0]["problem"]["code"] == "idempotency_key_reused"
        # POST /runs sees batch-made keys too.
        again = await client.post("/runs", json=item("z", idempotency_key="K2"))
        assert again.status_code == 200
        assert again.json()["run_id"] == results[1]["run"]["run_id"]


async def test_all_items_failing_write_nothing(settings: Settings, db: Database) -> None:
    await registered(db)
    async with support.api_client(settings, db, TENANT) as client:
        results = await batch(client, [{"workflow": "sb-nope"}, [], item(key=5)])  # type: ignore[arg-type]
        assert [r["status"] for r in results] == [404, 422, 422]
    assert await count(db, runs) == 0
    assert await count(db, events) == 0


async def test_whole_request_errors(settings: Settings, db: Database) -> None:
    await registered(db)
    async with support.api_client(settings, db, TENANT) as client:
        empty = await client.post("/runs:batch", json={"runs": []})
        assert empty.status_code == 422, empty.text
        over = await client.post("/runs:batch", json={"runs": [item()] * 1001})
        assert over.status_code == 422, over.text
        assert over.json()["limit"] == settings.max_batch_runs == 1000
        for body in ([item()], {"runs": item()}, {"runs": [item()], "extra": 1}, {}):
            resp = await client.post("/runs:batch", json=body)
            assert resp.status_code == 422, (body, resp.text)
        bad = await client.post(
            "/runs:batch", content=b'{"runs": [', headers={"content-type": "application/json"}
        )
        assert bad.status_code == 400
        assert bad.json()["code"] == "malformed_json"
    app = create_app(settings, db=db, check_schema_on_start=False)
    token = DevTokens(DEV_SECRET).mint(tenant_id=TENANT, subject="r", scopes=[Scope.RUNS_READ])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://test",
        headers={"Authorization": f"Bearer {token}"},
    ) as reader:
        refused = await reader.post("/runs:batch", json={"runs": [item()]})
        assert refused.status_code == 403
        anonymous = await reader.post(
            "/runs:batch", json={"runs": [item()]}, headers={"Authorization": ""}
        )
        assert anonymous.status_code == 401
    assert await count(db, runs) == 0


async def test_a_database_failure_mid_batch_writes_nothing(
    settings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    await registered(db)
    original = submits_q.insert_labels_many

    async def doubled(conn: Any, rows: Sequence[dict[str, Any]]) -> None:
        # The same label row twice: a real primary-key violation after the runs and
        # before the events were written.
        await original(conn, [*rows, *rows])

    monkeypatch.setattr(submits_q, "insert_labels_many", doubled)
    async with support.api_client(settings, db, TENANT) as client:
        resp = await client.post(
            "/runs:batch",
            json={
                "runs": [
                    item("a"),
                    item("b", labels={"x": "1"}),
                    {"workflow": "sb-one", "input": {"key": "x"}, "concurrency_key": "c1"},
                ]
            },
        )
        assert resp.status_code == 500, resp.text
    assert await count(db, runs) == 0
    assert await count(db, events) == 0
    assert await count(db, run_labels) == 0


async def test_an_integrity_error_other_than_the_key_is_not_retried(
    settings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A label primary-key violation is no idempotency race: one attempt, then the 500
    # POST /runs would give, and nothing written (the batch used to run it three times).
    await registered(db)
    attempts = 0
    insert_runs, insert_labels = submits_q.insert_runs, submits_q.insert_labels_many

    async def counted(conn: Any, rows: Any, *, delay: float | None) -> Any:
        nonlocal attempts
        attempts += 1
        return await insert_runs(conn, rows, delay=delay)

    async def doubled(conn: Any, rows: Sequence[dict[str, Any]]) -> None:
        await insert_labels(conn, [*rows, *rows])

    monkeypatch.setattr(submits_q, "insert_runs", counted)
    monkeypatch.setattr(submits_q, "insert_labels_many", doubled)
    async with support.api_client(settings, db, TENANT) as client:
        resp = await client.post("/runs:batch", json={"runs": [item("a", labels={"x": "1"})]})
        assert resp.status_code == 500, resp.text
    assert attempts == 1
    assert await count(db, runs) == 0


async def test_a_key_taken_by_a_concurrent_submit_is_answered_by_its_twin(
    settings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The idempotency race: another request commits runs with two of the batch's keys
    # after the batch's transaction began and before its INSERT. The INSERT skips them
    # (ON CONFLICT DO NOTHING) and the items get what POST /runs would answer: the twin
    # for the identical body (200), 409 for the other, in one attempt, neighbours kept.
    if db.dialect != "postgresql":
        pytest.skip("SQLite's write transaction holds the write lock from BEGIN: no race")
    await registered(db)
    submitter = Submitter(db, settings)
    attempts = 0
    theirs: list[str] = []
    insert_runs = submits_q.insert_runs

    async def raced(conn: Any, rows: Any, *, delay: float | None) -> Any:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            for key, value in (("same", "a"), ("other", "different")):
                row, created = await submitter.submit(
                    SubmitRequest(workflow="sb-job", input={"key": value}, idempotency_key=key),
                    tenant_id=TENANT,
                    subject="t",
                )
                assert created
                theirs.append(str(row["run_id"]))
        return await insert_runs(conn, rows, delay=delay)

    monkeypatch.setattr(submits_q, "insert_runs", raced)
    async with support.api_client(settings, db, TENANT) as client:
        results = await batch(
            client,
            [
                item("a", idempotency_key="same"),
                item("b", idempotency_key="other"),
                item("c", idempotency_key="fresh"),
            ],
        )
    assert attempts == 1
    assert [r["status"] for r in results] == [200, 409, 201]
    assert results[0]["run"]["run_id"] == theirs[0]
    assert results[1]["problem"]["code"] == "idempotency_key_reused"
    assert results[1]["problem"]["run_id"] == theirs[1]
    assert await count(db, runs) == 3
    # Only the batch's own new run has its run_submitted event from the batch.
    assert await count(db, events, events.c.kind == "run_submitted") == 3


async def test_a_thousand_runs_in_one_request(settings: Settings, db: Database) -> None:
    await registered(db)
    async with support.api_client(settings, db, TENANT) as client:
        items = [item(str(i), idempotency_key=f"k{i}") for i in range(1000)]
        results = await batch(client, items)
        assert {r["status"] for r in results} == {201}
        assert [r["run"]["input"]["key"] for r in results] == [str(i) for i in range(1000)]
        assert len({r["run"]["run_id"] for r in results}) == 1000
        replay = await batch(client, items)
        assert [r["run"]["run_id"] for r in replay] == [r["run"]["run_id"] for r in results]
        assert {r["status"] for r in replay} == {200}
    assert await count(db, runs) == 1000
    assert uuid.UUID(results[0]["run"]["run_id"])


async def test_the_body_is_the_response_models_bytes(settings: Settings, db: Database) -> None:
    # The 207 body is built without pydantic models (app/api/views.run_json): it must be
    # byte for byte what the documented SubmitBatchResponse dumps, failed items included.
    await registered(db)
    async with support.api_client(settings, db, TENANT) as client:
        items = [
            item("a", labels={"customer": "Zoë"}),
            item("ü \U0001f600", idempotency_key="kü", priority=5),
            item("ü \U0001f600", idempotency_key="kü", priority=5),
            {"workflow": "sb-nope", "input": {"key": "x"}},
            {"workflow": "sb-job", "input": {"nokey": 1}},
            item("d", delay=60),
        ]
        resp = await client.post("/runs:batch", json={"runs": items})
        assert resp.status_code == 207
        model = SubmitBatchResponse.model_validate_json(resp.content)
        assert resp.content == AsciiJSONResponse(model.model_dump(mode="json", by_alias=True)).body
        assert [r.status for r in model.results] == [201, 201, 200, 404, 422, 201]
        run = model.results[1].run
        assert run is not None
        one = await client.get(f"/runs/{run.run_id}")
        # The same run as its detail view shows it, but for the detail-only members.
        detail_only = {"step_counts": None, "blocked_reason": None}
        assert json.loads(resp.content)["results"][1]["run"] == {**one.json(), **detail_only}
