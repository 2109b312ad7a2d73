"""The document-flow state machine over real HTTP with two worker processes.

Both databases: submissions need a parent (concurrency key) and one review per document is
active; ``GET /runs/{id}`` shows the typed state; the 60 s review timer is fast-forwarded
by moving its deadline (the database clock is the only clock the engine reads); cancel
runs the compensation before the run reports ``cancelled``; the ``documents`` rows the
transitions wrote agree with each run.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Any

from sqlalchemy import text, update

from app.core.settings import Settings
from app.db.database import Database
from app.db.dialect import now_plus
from app.db.tables import runs, steps
from tests.acceptance.conftest import Stack
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

HANDLERS = "examples.document_flow"


def _db(stack: Stack) -> Database:
    return Database(Settings(database_url=stack.database_url, dev_secret=DEV_SECRET))


def documents(stack: Stack) -> dict[str, tuple[str, str | None]]:
    async def read() -> dict[str, tuple[str, str | None]]:
        db = _db(stack)
        try:
            async with db.read() as conn:
                rows = await conn.execute(
                    text("SELECT document_id, status, message FROM documents")
                )
                return {str(r[0]): (str(r[1]), r[2]) for r in rows}
        finally:
            await db.dispose()

    return asyncio.run(read())


def fast_forward(stack: Stack, run_id: str) -> None:
    """Make the run's pending review timer due now."""
    rid = uuid.UUID(run_id)

    async def move() -> None:
        db = _db(stack)
        try:
            async with db.write() as conn:
                past = now_plus(conn.dialect.name, -1)
                await conn.execute(
                    update(steps)
                    .where(steps.c.run_id == rid, steps.c.kind == "timer")
                    .values(deadline=past)
                )
                await conn.execute(
                    update(runs).where(runs.c.run_id == rid).values(available_at=past)
                )
        finally:
            await db.dispose()

    asyncio.run(move())


def test_document_flow_over_http_with_two_workers(stack: Stack) -> None:
    stack.start_worker(handlers=HANDLERS)
    stack.start_worker(handlers=HANDLERS)
    with stack.client() as c:
        versions = {w["name"]: w["versions"][0] for w in c.get("/workflows").json()["items"]}
        assert versions["document-flow"]["kind"] == "state_machine"
        assert [s["name"] for s in versions["document-flow"]["states"]] == [
            "Queued",
            "Waiting",
            "Completed",
            "Cancelled",
        ]
        no_parent = c.post("/runs", json={"workflow": "document-flow", "input": {"title": "x"}})
        assert no_parent.status_code == 422, no_parent.text

        def submit(doc: str, title: str) -> Any:
            return c.post(
                "/runs",
                json={
                    "workflow": "document-flow",
                    "input": {"title": title},
                    "concurrency_key": doc,
                },
            )

        ids = {}
        for doc in ("doc-a", "doc-b", "doc-c"):
            resp = submit(doc, f"Title {doc}")
            assert resp.status_code == 201, resp.text
            ids[doc] = resp.json()["run_id"]
        busy = submit("doc-a", "again")
        assert busy.status_code == 409, busy.text
        assert busy.json()["active_run_id"] == ids["doc-a"]

        def state(run_id: str, name: str, status: str) -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
            found = body["state"] and body["state"]["name"] == name and body["status"] == status
            return body if found else None

        for run_id in ids.values():
            waiting = wait_for_sync(
                functools.partial(state, run_id, "Waiting", "waiting_timer"), timeout=60
            )
            assert waiting["waiting_on"]["kind"] == "timer"
        assert {d: s for d, (s, _) in documents(stack).items()} == {
            "doc-a": "waiting",
            "doc-b": "waiting",
            "doc-c": "waiting",
        }

        fast_forward(stack, ids["doc-a"])
        done = wait_for_sync(
            functools.partial(state, ids["doc-a"], "Completed", "completed"), timeout=60
        )
        assert (done["status"], done["reason"]) == ("completed", "succeeded")
        assert done["output"] == {
            "name": "Completed",
            "fields": {"message": "'Title doc-a' reviewed after 60 s"},
        }

        resp = c.post(f"/runs/{ids['doc-b']}/cancel", json={"reason": "withdrawn by author"})
        assert resp.status_code < 300, resp.text
        result = c.get(f"/runs/{ids['doc-b']}/result", params={"wait": 30}).json()
        assert (result["status"], result["reason"]) == ("cancelled", "canceled_by_request")

        assert documents(stack) == {
            "doc-a": ("completed", "'Title doc-a' reviewed after 60 s"),
            "doc-b": ("cancelled", None),
            "doc-c": ("waiting", None),
        }
        # doc-a is finished: a new review of it is admitted; doc-c's is still active.
        assert submit("doc-a", "second review").status_code == 201
        assert submit("doc-c", "again").status_code == 409
