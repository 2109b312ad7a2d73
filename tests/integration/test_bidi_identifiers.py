"""No identifier or operator text the API takes may hold a bidi control (or a control).

One rule, ``app.core.text.text_problem`` (docs/api.md, "Conventions"): every bidirectional
control character (U+061C, U+200E/U+200F, U+202A..U+202E, U+2066..U+2069) and every control
character is refused with 422 in every such field, the problem naming the field and the
character; nothing is stored. Payload values (run input, signal payloads) are data and
keep them.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select

from app.core.settings import Settings
from app.core.text import BIDI_CONTROLS
from app.db.database import Database
from app.db.tables import api_keys, inbound_events, runs, schedules
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.integration.support import api_client

TENANT = "bidi"
BIDI = sorted(BIDI_CONTROLS)
ALL_BIDI = {
    0x061C, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E,
    0x2066, 0x2067, 0x2068, 0x2069,
}  # fmt: skip
CONTROLS = ["\x00", "\x1b", "\x7f", "\x85"]  # C0, ESC, DEL, C1 (NEL)
RUN = "00000000-0000-7000-8000-000000000001"  # bodies are checked before any lookup


class In(BaseModel):
    """Any input."""

    model_config = {"extra": "allow"}


@workflow("bidi-plain")
async def plain(ctx: WorkflowContext, input: In) -> None:
    """Never executed here."""


SCHEDULE = {"name": "s", "workflow": "bidi-plain", "cron": "0 0 * * *"}


def _body(**fields: Any) -> dict[str, Any]:
    return {"workflow": "bidi-plain", "input": {}, **fields}


# (method, path or path template with {v}, JSON body or None, where the problem names it,
#  whether the message is text_problem's own: free text, not a fixed alphabet)
FIELDS: list[tuple[str, str, Any, str, bool]] = [
    ("POST", "/runs", _body(workflow="bidi{v}"), "body.workflow", False),
    ("POST", "/runs", _body(idempotency_key="k{v}"), "body.idempotency_key", True),
    ("POST", "/runs", _body(concurrency_key="k{v}"), "body.concurrency_key", True),
    ("POST", "/runs", _body(version="v{v}"), "body.version", False),  # FIELD_RULES' words
    ("POST", "/runs", _body(labels={"team": "a{v}"}), "labels.team", False),
    ("POST", "/runs", _body(labels={"k{v}": "a"}), "labels.k", False),
    ("POST", "/runs:batch", {"runs": [_body(idempotency_key="k{v}")]}, "idempotency_key", True),
    ("GET", "/runs?idempotency_key=k{v}", None, "query.idempotency_key", True),
    ("GET", "/runs?version=v{v}", None, "query.version", True),
    ("GET", "/runs?workflow=w{v}", None, "query.workflow", False),
    ("POST", f"/runs/{RUN}/signals/go{{v}}", {}, "path.name", False),
    ("POST", f"/runs/{RUN}/cancel", {"reason": "r{v}"}, "body.reason", True),
    ("POST", f"/runs/{RUN}/retry", {"reason": "r{v}", "correlation_id": "c"}, "body.reason", True),
    (
        "POST",
        f"/runs/{RUN}/retry",
        {"reason": "r", "correlation_id": "c{v}"},
        "correlation_id",
        True,
    ),
    (
        "POST",
        f"/runs/{RUN}/approvals/s",
        {"decision": "approve", "comment": "c{v}"},
        "comment",
        True,
    ),
    ("POST", "/events", {"name": "e{v}", "data": {}}, "body.name", False),
    ("POST", "/events", {"name": "e", "data": {}, "key": "k{v}"}, "body.key", True),
    ("POST", "/admin/api-keys", {"name": "n{v}", "scopes": ["runs:read"]}, "body.name", True),
    (
        "POST",
        "/admin/api-keys",
        {"name": "n", "scopes": ["runs:read"], "tenant": "t{v}"},
        "tenant",
        False,
    ),
    ("POST", "/schedules", {**SCHEDULE, "name": "s{v}"}, "body.name", False),
    ("POST", "/schedules", {**SCHEDULE, "cron": "0 0 * * *{v}"}, "cron", True),
    ("POST", "/schedules", {**SCHEDULE, "timezone": "UTC{v}"}, "timezone", True),
]


def _fill(template: Any, char: str) -> Any:
    # The character in every string of the template (keys too), as the client sends it.
    if isinstance(template, str):
        return template.replace("{v}", char)
    if isinstance(template, dict):
        return {_fill(k, char): _fill(v, char) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, char) for v in template]
    return template


async def _stored(db: Database) -> list[int]:
    async with db.read() as conn:
        return [
            int((await conn.execute(select(func.count()).select_from(t))).scalar_one())
            for t in (runs, inbound_events, schedules, api_keys)
        ]


def test_the_rule_covers_every_bidi_control() -> None:
    assert {ord(c) for c in BIDI_CONTROLS} == ALL_BIDI


@pytest.mark.parametrize(
    ("method", "path", "body", "where", "own"), FIELDS, ids=lambda v: str(v)[:40]
)
async def test_every_identifier_refuses_every_bidi_control(
    settings: Settings, db: Database, method: str, path: str, body: Any, where: str, own: bool
) -> None:
    async with db.write() as conn:
        await Registry([plain]).register(conn)
    before = await _stored(db)
    async with api_client(settings, db, TENANT) as api:
        for char in BIDI + CONTROLS:
            content = None if body is None else json.dumps(_fill(body, char))
            resp = await api.request(
                method, path.replace("{v}", quote(char)), content=content,
                headers={"content-type": "application/json"},
            )  # fmt: skip
            what = (path, where, hex(ord(char)), resp.status_code, resp.text[:400])
            if path == "/runs:batch":
                assert resp.status_code == 207, what
                problem = resp.json()["results"][0]["problem"]
            else:
                assert resp.status_code == 422, what
                problem = resp.json()
            paths = [e["path"] for e in problem.get("errors", [])]
            assert any(where in p for p in paths), (what, paths)
            if own:
                messages = " ".join(e["message"] for e in problem["errors"])
                assert f"U+{ord(char):04X}" in messages, (what, messages)
                kind = "bidirectional control" if char in BIDI_CONTROLS else "control"
                assert f"{kind} characters are not allowed" in messages, (what, messages)
    assert await _stored(db) == before


async def test_the_idempotency_key_header_refuses_them_too(
    settings: Settings, db: Database
) -> None:
    async with db.write() as conn:
        await Registry([plain]).register(conn)
    async with api_client(settings, db, TENANT) as api:
        for char in BIDI:
            resp = await api.post(
                "/runs", json=_body(), headers={b"Idempotency-Key": f"k{char}".encode()}
            )
            assert resp.status_code == 422, (hex(ord(char)), resp.text)
            assert resp.json()["errors"][0]["path"] == "header.Idempotency-Key"
    assert (await _stored(db))[0] == 0


async def test_payload_values_keep_them_as_data(settings: Settings, db: Database) -> None:
    async with db.write() as conn:
        await Registry([plain]).register(conn)
    text = "".join(BIDI) + "\x00"
    async with api_client(settings, db, TENANT) as api:
        created = await api.post("/runs", json=_body(input={"note": text, text: 1}))
        assert created.status_code == 201, created.text
        run = (await api.get(f"/runs/{created.json()['run_id']}")).json()
        assert run["input"] == {"note": text, text: 1}
        sent = await api.post(f"/runs/{run['run_id']}/signals/go", json={"payload": {"note": text}})
        assert sent.status_code == 202, sent.text
