"""Unit tests of examples/document_flow.py with the test kit (app.sdk.testing).

A template for state-machine authors: the real engine runs in-process on a throwaway
SQLite database, the 60 s review timer passes on the virtual clock in milliseconds, and
the test reads the ``documents`` table the transitions wrote.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from app.sdk.testing import RunStatus, WorkflowTestEnv
from examples.document_flow import REVIEW_SECONDS, DocumentInput, document_flow

FLOW = document_flow.definition


async def document(env: WorkflowTestEnv, document_id: str) -> dict[str, Any] | None:
    async with env.database.read() as conn:
        row = (
            await conn.execute(
                text("SELECT status, message, transitions FROM documents WHERE document_id = :d"),
                {"d": document_id},
            )
        ).first()
    return None if row is None else dict(row._mapping)


async def test_review_completes_after_the_timer() -> None:
    async with WorkflowTestEnv([FLOW]) as env:
        run = await env.start(FLOW, DocumentInput(title="Q3 report"), concurrency_key="doc-1")
        snapshot = await env.get(run)
        assert snapshot.status == RunStatus.WAITING_TIMER
        assert await document(env, "doc-1") == {
            "status": "waiting",
            "message": None,
            "transitions": 1,
        }

        await env.skip(REVIEW_SECONDS - 1)
        assert (await env.get(run)).status == RunStatus.WAITING_TIMER
        await env.skip(1)
        result = await env.result(run)

        assert result == {
            "name": "Completed",
            "fields": {"message": "'Q3 report' reviewed after 60 s"},
        }
        assert await document(env, "doc-1") == {
            "status": "completed",
            "message": "'Q3 report' reviewed after 60 s",
            "transitions": 2,
        }


async def test_withdrawn_document_ends_cancelled() -> None:
    async with WorkflowTestEnv([FLOW]) as env:
        run = await env.start(FLOW, DocumentInput(title="Draft"), concurrency_key="doc-2")
        async with env.database.write() as conn:
            await conn.execute(
                text("UPDATE documents SET status = 'withdrawn' WHERE document_id = 'doc-2'")
            )
        await env.skip(REVIEW_SECONDS)
        assert await env.result(run) == {"name": "Cancelled", "fields": {}}
        assert (await document(env, "doc-2") or {})["status"] == "cancelled"


async def test_cancel_compensates_the_document() -> None:
    async with WorkflowTestEnv([FLOW]) as env:
        run = await env.start(FLOW, DocumentInput(title="Memo"), concurrency_key="doc-3")
        cancelled = await env.cancel(run, reason="no longer needed")
        assert cancelled.status == RunStatus.CANCELLED
        assert await document(env, "doc-3") == {
            "status": "cancelled",
            "message": None,
            "transitions": 2,
        }
        # A new review of the same document may start once the first one is terminal.
        again = await env.start(FLOW, DocumentInput(title="Memo v2"), concurrency_key="doc-3")
        assert (await env.get(again)).status == RunStatus.WAITING_TIMER
        assert (await document(env, "doc-3") or {})["status"] == "waiting"
