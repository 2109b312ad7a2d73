"""``run_json`` is ``run_view``'s JSON, byte for byte, on both databases.

``POST /runs:batch`` answers with :func:`app.api.views.run_json` (no pydantic model per
run); every other view dumps :func:`app.api.views.run_view`. Rows in every status, with
labels, nulls, unicode, big numbers, redaction, waits, leases, pauses and reruns are read
back from the database (so each dialect's column types are the ones compared) and both
forms are encoded by the app's response class.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic_core import to_jsonable_python
from sqlalchemy import select, update

from app.api import schemas
from app.api.responses import AsciiJSONResponse
from app.api.views import run_json, run_view
from app.core import json
from app.core.ids import new_run_id
from app.core.status import RunReason, RunStatus
from app.db.database import Database
from app.db.queries import run_labels as labels_q
from app.db.queries import runs as runs_q
from app.db.tables import runs

AT = datetime(2026, 12, 3, 10, 0, 0, tzinfo=UTC)

# Per case: the run's input and the columns set after the insert.
CASES: list[tuple[Any, dict[str, Any]]] = [
    ({"key": "plain"}, {}),
    (
        {"ünïcødé": "日本語 \U0001f600", "nul": "a\u0000b", "big": 2**70, "f": 1.5e-7},
        {"idempotency_key": "clé-1", "labels": labels_q.encode({"customer": "Zoë", "tier": "1"})},
    ),
    (
        [1, 2.0, None, True, "x"],
        {
            "status": RunStatus.RUNNING.value,
            "attempt": 3,
            "lease_owner": "worker-ü",
            "lease_expires_at": AT + timedelta(seconds=30, microseconds=120),
            "started_at": AT + timedelta(microseconds=1),
            "concurrency_key": "acct-7",
            "concurrency_slot": 2,
            "priority": -100,
        },
    ),
    (
        "just a string",
        {
            "status": RunStatus.WAITING_SIGNAL.value,
            "waiting_kind": "signal",
            "waiting_name": "payment",
            "waiting_deadline": AT + timedelta(hours=1),
            "paused_at": AT,
            "paused_by": "op",
            "pause_reason": "incident ✓",
            "blocked_reason": "waits for a slot",
        },
    ),
    (
        {"key": "timer"},
        {
            "status": RunStatus.WAITING_TIMER.value,
            "waiting_kind": "timer",
            "waiting_deadline": None,
        },
    ),
    (
        {"key": "done"},
        {
            "status": RunStatus.COMPLETED.value,
            "reason": RunReason.SUCCEEDED.value,
            "output": json.dumps({"total": 12.25, "items": [], "deep": {"a": {"b": [None]}}}),
            "finished_at": AT + timedelta(minutes=5),
            "compacted_at": AT + timedelta(days=1),
            "rerun_of": uuid.UUID(int=7),
            "rerun_from_step": "charge#1",
            "parent_run_id": uuid.UUID(int=8),
            "access": "owner",
        },
    ),
    (
        {"secret": "card"},
        {
            "status": RunStatus.FAILED.value,
            "reason": RunReason.FAILURE_AUTHORIZATION.value,
            "output": json.dumps("hidden"),
            "error": json.dumps({"type": "Unauthorized", "message": "key revoked"}),
            "finished_at": AT,
        },
    ),
    (
        None,
        {
            "status": RunStatus.CANCELLED.value,
            "reason": RunReason.CANCELED_BY_REQUEST.value,
            "error": json.dumps("plain text error"),
        },
    ),
    # Every status at least once more.
    *(({"status": s.value}, {"status": s.value}) for s in RunStatus),
]


def encoded(content: Any) -> bytes:
    return bytes(AsciiJSONResponse(content).body)


async def stored_rows(db: Database) -> list[Any]:
    ids = []
    async with db.write() as conn:
        for i, (payload, columns) in enumerate(CASES):
            row = await runs_q.insert_run(
                conn,
                {
                    "run_id": new_run_id(),
                    "tenant_id": "rj",
                    "workflow": "rj-flow",
                    "version": f"v{i}",
                    "status": RunStatus.QUEUED.value,
                    "input": json.dumps(payload),
                    "idempotency_key": None,
                    "request_hash": "0" * 64,
                    "concurrency_key": None,
                    "created_by": "alice ☃",
                    "api_key_id": None,
                    "access": "tenant",
                    "parent_run_id": None,
                    "delay": None,
                    "priority": 0,
                    "concurrency_slot": None,
                    "blocked_reason": None,
                    "labels": labels_q.encode({}),
                    "trace_parent": None,
                    "trace_state": None,
                },
            )
            assert row is not None
            if columns:
                await conn.execute(
                    update(runs).where(runs.c.run_id == row["run_id"]).values(**columns)
                )
            ids.append(row["run_id"])
    async with db.read() as conn:
        found = (await conn.execute(select(runs).where(runs.c.run_id.in_(ids)))).mappings()
        by_id = {r["run_id"]: r for r in found}
    return [by_id[i] for i in ids]


async def test_run_json_is_the_models_json(db: Database) -> None:
    rows = await stored_rows(db)
    for row in rows:
        expected = run_view(row).model_dump(mode="json", by_alias=True)
        assert list(run_json(row)) == list(schemas.Run.model_fields)
        assert encoded(run_json(row)) == encoded(expected), row["version"]
    # The detail view's extras take the same path.
    extras: dict[str, Any] = {
        "step_counts": {"succeeded": 2, "running": 1},
        "blocked": "no live worker registered version v0",
        "state": {"name": "Shipped", "fields": {"tracking": "Ω-1", "n": 3}},
    }
    assert encoded(run_json(rows[0], **extras)) == encoded(
        run_view(rows[0], **extras).model_dump(mode="json", by_alias=True)
    )
    redacted = run_json(rows[6])
    assert redacted["redacted"] is True and redacted["input"] is None
    assert redacted["output"] is None


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 120, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 999999, tzinfo=timezone(timedelta(hours=-5))),
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(0))),
        datetime(2026, 1, 2, 3, 4, 5, 500000),
    ],
)
def test_instant_is_pydantics_datetime_form(value: datetime) -> None:
    # run_json converts with pydantic_core's to_jsonable_python; a serializer setting on
    # the schemas (a custom datetime form) would make the two differ.
    assert (
        to_jsonable_python(value)
        == schemas.WaitingOn(kind="timer", deadline=value).model_dump(mode="json")["deadline"]
    )
