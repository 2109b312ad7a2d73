"""Values at the edges of what Python can hold get a clear 4xx and store nothing.

Found by a black-box session, each a 500 before: an integer of more digits than Python
converts (4,300) in any JSON body; an aware datetime at the ends of the calendar whose
UTC value does not exist (``0001-01-01T00:00:00+23:59``) in a schedule's ``at`` or a bulk
action's filter. Each kind is sent to every endpoint that takes it.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select

from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import inbound_events, runs, schedules
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.integration.support import api_client

TENANT = "edge"
HUGE = "9" * 5000
EDGES = ("0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59")


class In(BaseModel):
    """Any input."""

    model_config = {"extra": "allow"}


@workflow("edge-plain")
async def plain(ctx: WorkflowContext, input: In) -> None:
    """Never executed here."""


async def _counts(db: Database) -> tuple[int, int, int]:
    async with db.read() as conn:
        got = []
        for table in (runs, inbound_events, schedules):
            got.append(
                int((await conn.execute(select(func.count()).select_from(table))).scalar_one())
            )
    return got[0], got[1], got[2]


async def _register(db: Database) -> None:
    async with db.write() as conn:
        await Registry([plain]).register(conn)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/runs", '{"workflow": "edge-plain", "input": {"x": %s}}'),
        ("/runs:batch", '{"runs": [{"workflow": "edge-plain", "input": {"x": %s}}]}'),
        ("/events", '{"name": "edge.happened", "data": {"x": %s}}'),
        (
            "/schedules",
            '{"name": "s", "workflow": "edge-plain", "input": {"x": %s}, "cron": "0 0 * * *"}',
        ),
    ],
)
async def test_an_integer_past_the_digit_limit_is_400(
    settings: Settings, db: Database, path: str, body: str
) -> None:
    await _register(db)
    before = await _counts(db)
    async with api_client(settings, db, TENANT) as api:
        answer = await api.post(
            path, content=body % HUGE, headers={"Content-Type": "application/json"}
        )
        assert answer.status_code == 400, answer.text
        problem = answer.json()
        assert problem["code"] == "malformed_json"
        assert "4300 digits" in problem["detail"] and "string" in problem["detail"]
        # The same number as a string is an ordinary value.
        fine = await api.post(
            path, content=body % f'"{HUGE}"', headers={"Content-Type": "application/json"}
        )
        assert fine.status_code < 300, fine.text
    after = await _counts(db)
    assert sum(after) == sum(before) + 1


@pytest.mark.parametrize("edge", EDGES)
async def test_an_instant_without_a_utc_value_is_422(
    settings: Settings, db: Database, edge: str
) -> None:
    await _register(db)
    before = await _counts(db)
    async with api_client(settings, db, TENANT) as api:
        created = await api.post(
            "/schedules", json={"name": "once", "workflow": "edge-plain", "at": edge}
        )
        assert created.status_code == 422, created.text
        assert created.json()["code"] == "invalid_request"
        assert "years 1 to 9999" in created.text
        ok = await api.post(
            "/schedules",
            json={"name": "later", "workflow": "edge-plain", "at": "2999-01-01T00:00:00Z"},
        )
        assert ok.status_code == 201, ok.text
        patched = await api.patch(f"/schedules/{ok.json()['schedule_id']}", json={"at": edge})
        assert patched.status_code == 422, patched.text
        for verb in ("cancel", "retry"):
            for bound in ("created_after", "created_before"):
                body: dict[str, Any] = {"filter": {bound: edge}, "dry_run": True}
                if verb == "retry":
                    body["reason"] = "edge"
                bulk = await api.post(f"/runs:{verb}", json=body)
                assert bulk.status_code == 422, (verb, bound, bulk.text)
                assert "years 1 to 9999" in bulk.text
    assert await _counts(db) == (before[0], before[1], before[2] + 1)


@pytest.mark.parametrize(
    "query",
    [
        "status=failed&status=completed",
        "workflow=a&workflow=b",
        "limit=5&limit=6",
        "label.region=eu&label.region=us",
        "waiting_on=bogus",
        "waiting_on=aproval",
        "waiting_on=Signal",
    ],
)
async def test_list_filters_refuse_repeats_and_unknown_wait_kinds(
    settings: Settings, db: Database, query: str
) -> None:
    async with api_client(settings, db, TENANT) as api:
        listed = await api.get(f"/runs?{query}")
        assert listed.status_code == 422, listed.text
        name = query.split("=")[0]
        assert any(name in e["path"] for e in listed.json()["errors"]), listed.text
        if "status" not in query and "limit" not in query:
            counted = await api.get(f"/runs/counts?{query}")
            assert counted.status_code == 422, counted.text
        for kind in ("retry", "timer", "signal:go", "approval:a", "event:x.y", "child", "pause"):
            fine = await api.get("/runs", params={"waiting_on": kind})
            assert fine.status_code == 200, (kind, fine.text)


async def test_a_non_ascii_idempotency_key_header_is_read_as_utf8(
    settings: Settings, db: Database
) -> None:
    await _register(db)
    async with api_client(settings, db, TENANT) as api:
        raw = {b"Idempotency-Key": "café-☕".encode(), b"Content-Type": b"application/json"}
        body = b'{"workflow": "edge-plain", "input": {}}'
        first = await api.post("/runs", content=body, headers=raw)
        assert first.status_code == 201, first.text
        assert first.json()["idempotency_key"] == "café-☕"
        # The same key in the body is the same request.
        again = await api.post(
            "/runs", json={"workflow": "edge-plain", "input": {}, "idempotency_key": "café-☕"}
        )
        assert again.status_code == 200 and again.json()["run_id"] == first.json()["run_id"]
        both = await api.post(
            "/runs",
            content=b'{"workflow": "edge-plain", "input": {}, '
            b'"idempotency_key": "caf\\u00e9-\\u2615"}',
            headers=raw,
        )
        assert both.status_code == 200, both.text
        bad = await api.post(
            "/runs",
            content=body,
            headers={b"Idempotency-Key": b"caf\xe9", b"Content-Type": b"application/json"},
        )
        assert bad.status_code == 422, bad.text
        assert "UTF-8" in bad.json()["detail"]


LEAKS = ("constrained-str", "function-after", "string_pattern_mismatch", "int_type", "Value error")


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        # version: a union of a whole number and a bounded text
        ("POST", "/runs", '{"workflow": "edge-plain", "version": 1.5}', "version"),
        ("POST", "/runs", '{"workflow": "edge-plain", "version": ""}', "version"),
        ("POST", "/runs", '{"workflow": "edge-plain", "version": "a\\u0000"}', "version"),
        ("POST", "/runs", '{"workflow": "edge-plain", "version": "%s"}' % ("v" * 65), "version"),
        ("POST", "/runs", '{"workflow": "edge-plain", "version": [1]}', "version"),
        (
            "POST",
            "/runs:batch",
            '{"runs": [{"workflow": "edge-plain", "version": true}]}',
            "version",
        ),
        (
            "POST",
            "/schedules",
            '{"name": "s", "workflow": "edge-plain", "cron": "0 0 * * *", "version": {}}',
            "version",
        ),
        # delay: finite seconds in a range
        ("POST", "/runs", '{"workflow": "edge-plain", "delay": NaN}', "delay"),
        ("POST", "/runs", '{"workflow": "edge-plain", "delay": Infinity}', "delay"),
        ("POST", "/runs", '{"workflow": "edge-plain", "delay": 1e999}', "delay"),
        ("POST", "/runs", '{"workflow": "edge-plain", "delay": -1}', "delay"),
        ("POST", "/runs:batch", '{"runs": [{"workflow": "edge-plain", "delay": NaN}]}', "delay"),
    ],
)
async def test_a_bad_field_is_named_with_its_rule_in_user_terms(
    settings: Settings, db: Database, method: str, path: str, body: str, field: str
) -> None:
    await _register(db)
    before = await _counts(db)
    async with api_client(settings, db, TENANT) as api:
        resp = await api.request(
            method, path, content=body, headers={"content-type": "application/json"}
        )
        if path == "/runs:batch":
            assert resp.status_code == 207, resp.text
            problem = resp.json()["results"][0]["problem"]
        else:
            assert resp.status_code == 422, resp.text
            problem = resp.json()
            assert problem["detail"].startswith(f"request does not match the API schema: {field} ")
        assert [e["path"].rsplit(".", 1)[-1] for e in problem["errors"]] == [field]
        message = problem["errors"][0]["message"]
        assert message.startswith("must be"), message
        assert not any(leak in resp.text for leak in LEAKS), resp.text
    assert await _counts(db) == before


async def test_a_bad_wait_is_named_with_its_rule(settings: Settings, db: Database) -> None:
    async with api_client(settings, db, TENANT) as api:
        for wait in ("nan", "inf", "-1", "301"):
            resp = await api.get(f"/runs/{'0' * 8}-0000-7000-8000-{'0' * 12}/result?wait={wait}")
            assert resp.status_code == 422, (wait, resp.text)
            assert resp.json()["errors"] == [
                {
                    "path": "query.wait",
                    "message": "must be a number of seconds from 0 to 300 (not NaN or infinite)",
                }
            ]
