"""The API tells the truth about a run, over real HTTP, on both databases.

Against a real ``treadle serve`` and a real worker process:

- an idempotent retry is the same request whatever its JSON spelling (key order, number
  forms) while strings compare exactly, and fingerprints stored by the old algorithm
  still match identical retries;
- an admin's cross-tenant (``?tenant=``) report, steps and events show the run's rows,
  exactly as the owning tenant sees them;
- a DAG branch cancelled because its sibling failed says so (``canceled_by_failure``),
  and a rejected approval is ``failed`` / ``rejected_by_approver``, in steps and report;
- the text report, the CLI and problem details stay whole whatever an error message or
  step name holds (lone surrogate, NUL, ESC, CR/LF, RTL override).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import unicodedata
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import runs
from app.engine.registry import Registry
from app.engine.submit import SubmitRequest
from tests.acceptance.conftest import ROOT, Stack, token
from tests.acceptance.fidelity_handlers import HOSTILE, HOSTILE_STEP
from tests.acceptance.test_http_input import assert_problem, describe
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

pytestmark = pytest.mark.timeout(300)  # an API and a worker process on a loaded machine

HANDLERS = "tests.acceptance.fidelity_handlers"
# What a plain-text line may never hold raw: C0 controls but LF (the layout), DEL, C1,
# lone surrogates, bidi controls, line/paragraph separators.
RAW_FORBIDDEN = {"\x00", "\x07", "\x1b", "\r", "\x7f", "\u202e", "\u2028", "\ud800"}


def _register(stack: Stack) -> None:
    async def register() -> None:
        db = Database(Settings(database_url=stack.database_url, dev_secret=DEV_SECRET))
        try:
            async with db.write() as conn:
                await Registry.from_modules([HANDLERS]).register(conn)
        finally:
            await db.dispose()

    asyncio.run(register())


def _post_raw(c: httpx.Client, body: str) -> httpx.Response:
    # Sent verbatim: the test chooses the key order and number spelling byte for byte.
    return c.post("/runs", content=body.encode(), headers={"Content-Type": "application/json"})


def test_idempotent_retry_is_the_same_json_in_any_spelling(stack: Stack) -> None:
    _register(stack)
    with stack.client(token(tenant="idem")) as c:
        first = _post_raw(
            c,
            '{"workflow": "fid-approve", "idempotency_key": "k-1", "delay": 3600,'
            ' "input": {"name": "n", "extra": {"b": [1, 2.5, {"y": 0, "x": -0}],'
            ' "a": 1, "big": 12345678901234567890}}}',
        )
        assert first.status_code == 201, describe(first)
        run = first.json()
        retries = {
            "keys reordered at every level": (
                '{"input": {"extra": {"big": 12345678901234567890, "a": 1,'
                ' "b": [1, 2.5, {"x": -0, "y": 0}]}, "name": "n"},'
                ' "delay": 3600, "idempotency_key": "k-1", "workflow": "fid-approve"}'
            ),
            "integral numbers as floats": (
                '{"workflow": "fid-approve", "idempotency_key": "k-1", "delay": 3.6e3,'
                ' "input": {"name": "n", "extra": {"b": [1.0, 25e-1, {"y": 0.0, "x": -0.0}],'
                ' "a": 1e0, "big": 12345678901234567890}}}'
            ),
        }
        for what, body in retries.items():
            again = _post_raw(c, body)
            assert again.status_code == 200, f"{what}: {describe(again)}"
            assert again.json()["run_id"] == run["run_id"], what

        # Strings compare exactly: NFC and NFD spell the same text differently.
        nfc = unicodedata.normalize("NFC", "café")
        nfd = unicodedata.normalize("NFD", "café")
        assert nfc != nfd
        base = {"workflow": "fid-approve", "idempotency_key": "k-2"}
        assert c.post("/runs", json={**base, "input": {"name": nfc}}).status_code == 201
        same = c.post("/runs", json={**base, "input": {"name": nfc}})
        assert same.status_code == 200, describe(same)
        other = c.post("/runs", json={**base, "input": {"name": nfd}})
        assert_problem(other, 409, "idempotency_key_reused", "NFD is another string")
        # A different number, type or option is a different request.
        first3 = c.post(
            "/runs",
            json={"workflow": "fid-approve", "idempotency_key": "k-4", "input": {"name": "n"}},
        )
        assert first3.status_code == 201, describe(first3)
        for what, changed_input in {
            "an extra field": {"name": "n", "n": 1},
            "priority": {"name": "n"},
        }.items():
            extra = {"priority": 5} if what == "priority" else {}
            resp = c.post(
                "/runs",
                json={
                    "workflow": "fid-approve",
                    "idempotency_key": "k-4",
                    "input": changed_input,
                    **extra,
                },
            )
            assert_problem(resp, 409, "idempotency_key_reused", what)
        for a, b in [(1, 1.5), (1, "1"), (1, True), (0, False), (None, 0)]:
            key = f"k-{a!r}-{b!r}"
            made = c.post(
                "/runs",
                json={
                    "workflow": "fid-approve",
                    "idempotency_key": key,
                    "input": {"name": "n", "v": a},
                },
            )
            assert made.status_code == 201, describe(made)
            resp = c.post(
                "/runs",
                json={
                    "workflow": "fid-approve",
                    "idempotency_key": key,
                    "input": {"name": "n", "v": b},
                },
            )
            assert_problem(resp, 409, "idempotency_key_reused", f"{a!r} vs {b!r}")

    # A run stored before fingerprints were canonical keeps its old hash: an identical
    # retry still finds it (200), a different request is still refused (409).
    legacy_body = {
        "workflow": "fid-approve",
        "idempotency_key": "k-legacy",
        "input": {"name": "n", "z": 1, "a": 2.0},
    }
    with stack.client(token(tenant="idem")) as c:
        created = c.post("/runs", json=legacy_body)
        assert created.status_code == 201, describe(created)
    legacy = SubmitRequest(
        workflow="fid-approve", input={"name": "n", "z": 1, "a": 2.0}, idempotency_key="k-legacy"
    ).legacy_fingerprint()

    async def store_legacy_hash() -> None:
        db = Database(Settings(database_url=stack.database_url, dev_secret=DEV_SECRET))
        try:
            async with db.write() as conn:
                await conn.execute(
                    update(runs)
                    .where(runs.c.run_id == uuid.UUID(created.json()["run_id"]))
                    .values(request_hash=legacy)
                )
        finally:
            await db.dispose()

    asyncio.run(store_legacy_hash())
    with stack.client(token(tenant="idem")) as c:
        again = c.post("/runs", json=legacy_body)
        assert again.status_code == 200, describe(again)
        assert again.json()["run_id"] == created.json()["run_id"]
        changed = c.post("/runs", json={**legacy_body, "input": {"name": "n", "z": 2, "a": 2.0}})
        assert_problem(changed, 409, "idempotency_key_reused", "legacy hash, other input")


def _wait(c: httpx.Client, run_id: str, *statuses: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        resp = c.get(f"/runs/{run_id}")
        assert resp.status_code == 200, describe(resp)
        body: dict[str, Any] = resp.json()
        return body if body["status"] in statuses else None

    return wait_for_sync(probe, timeout=60, what=f"run {run_id} in {statuses}")


def _decide(c: httpx.Client, run_id: str, decision: str) -> None:
    resp = c.post(f"/runs/{run_id}/approvals/gate", json={"decision": decision, "comment": "no"})
    assert resp.status_code == 200, describe(resp)


def _report(c: httpx.Client, run_id: str, **params: str) -> httpx.Response:
    resp = c.get(f"/runs/{run_id}/report", params=params)
    assert resp.status_code == 200, describe(resp)
    return resp


def _assert_safe_text(text: str, what: str) -> None:
    raw = sorted(repr(ch) for ch in RAW_FORBIDDEN if ch in text)
    assert not raw, f"{what} holds raw {raw}"
    for line in text.splitlines():
        assert unicodedata.category(line[:1] or "a") != "Cc", (what, line)


def test_views_tell_the_truth(stack: Stack) -> None:
    stack.start_worker(handlers=HANDLERS)
    submitter = token(tenant="acme", subject="alice")
    approver = token(tenant="acme", subject="bob")
    with stack.client(submitter) as c:
        ids = {
            name: c.post("/runs", json={"workflow": name, "input": {"name": name}}).json()["run_id"]
            for name in ("fid-hostile", "fid-dag", "fid-approve", "fid-approve-handled")
        }
        for name in ("fid-approve", "fid-approve-handled"):
            _wait(c, ids[name], "waiting_approval")
    with stack.client(approver) as c:
        for name in ("fid-approve", "fid-approve-handled"):
            _decide(c, ids[name], "reject")
    with stack.client(submitter) as c:
        hostile = _wait(c, ids["fid-hostile"], "failed")
        dag = _wait(c, ids["fid-dag"], "failed")
        rejected = _wait(c, ids["fid-approve"], "failed")
        handled = _wait(c, ids["fid-approve-handled"], "completed")
        assert HOSTILE in hostile["error"]["message"]  # JSON keeps the message exactly
        assert (dag["reason"], rejected["reason"]) == ("failure_non_retryable",) * 2
        assert handled["output"] is False

        # Item: a cancelled sibling and a rejected approval say what happened to them.
        dag_steps = {
            s["step_id"]: s for s in c.get(f"/runs/{ids['fid-dag']}/steps").json()["items"]
        }
        assert (dag_steps["failing_branch"]["status"], dag_steps["failing_branch"]["reason"]) == (
            "failed",
            "failure_non_retryable",
        )
        sibling = dag_steps["slow_sibling"]
        assert (sibling["status"], sibling["reason"]) == ("cancelled", "canceled_by_failure")
        assert sibling["error"]["reason"] == "canceled_by_failure"
        assert "failing_branch" in sibling["error"]["message"]
        filtered = c.get(f"/runs/{ids['fid-dag']}/steps", params={"reason": "canceled_by_failure"})
        assert [s["step_id"] for s in filtered.json()["items"]] == ["slow_sibling"]
        none = c.get(f"/runs/{ids['fid-dag']}/steps", params={"reason": "canceled_by_request"})
        assert none.json()["items"] == []
        for name in ("fid-approve", "fid-approve-handled"):
            gate = c.get(f"/runs/{ids[name]}/steps").json()["items"][0]
            assert (gate["step_id"], gate["status"], gate["reason"]) == (
                "gate",
                "failed",
                "rejected_by_approver",
            ), name
            assert gate["output"]["approved"] is False
            assert "rejected by bob" in gate["error"]["message"]
            report = _report(c, ids[name]).json()
            assert [(s["status"], s["reason"]) for s in report["steps"]][:1] == [
                ("failed", "rejected_by_approver")
            ]
            assert report["run"]["step_counts"].get("succeeded", 0) == (
                1 if name == "fid-approve-handled" else 0  # the on_reject step
            )
            text = _report(c, ids[name], format="text").text
            (line,) = [x for x in text.splitlines() if " gate " in x]
            assert "failed" in line and "(rejected_by_approver)" in line, line
        dag_text = _report(c, ids["fid-dag"], format="text").text
        (line,) = [x for x in dag_text.splitlines() if " slow_sibling " in x]
        assert "cancelled" in line and "(canceled_by_failure)" in line, line

        # Item: the text report of any string the JSON side accepts is whole and shows no
        # raw control, surrogate or bidi character, yet every part of the message is there.
        json_report = _report(c, ids["fid-hostile"]).json()
        assert json_report["steps"][0]["step_id"] == HOSTILE_STEP
        for params, headers in (({"format": "text"}, {}), ({}, {"Accept": "text/plain"})):
            resp = c.get(f"/runs/{ids['fid-hostile']}/report", params=params, headers=headers)
            assert resp.status_code == 200, describe(resp)
            assert resp.headers["content-type"].startswith("text/plain")
            text = resp.content.decode("utf-8")  # strict: it must be valid UTF-8
            _assert_safe_text(text, "text report")
            for escaped in ("\\ud800", "\\u0000", "\\u001b", "\\u202e", "\\u000a", "\\u000d"):
                assert escaped in text, escaped
            # The forged section header stays inside its line: four sections, no more.
            assert text.count("\n== DEAD LETTERS") == 1
            assert "name\\u202eevil\\u000aforged" in text

        # The CLI prints the same runs without crashing its own encoder.
        env = {**os.environ, "TREADLE_URL": stack.url, "TREADLE_TOKEN": submitter}
        for args in (
            ["runs", "report", ids["fid-hostile"]],
            ["runs", "get", ids["fid-hostile"]],  # a rich table
            ["runs", "get", ids["fid-hostile"], "-o", "json"],
        ):
            done = subprocess.run(
                [sys.executable, "-m", "app.cli.main", *args],
                cwd=ROOT,
                env={**env, "PYTHONIOENCODING": "utf-8", "PYTHONPATH": str(ROOT)},
                capture_output=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr.decode(errors="replace")
            out = done.stdout.decode("utf-8")
            _assert_safe_text(out, f"treadle {' '.join(args)}")
            if args[-1] == "json":
                shown = json.loads(out)  # the escapes sit inside strings: still JSON
                assert shown["error"]["message"] == hostile["error"]["message"]

        # Problem details quoting hostile text stay problem+json (no 500, no dropped
        # connection): an idempotency key cannot hold one, so use a run id path.
        bad = c.get("/runs/%ED%A0%80%E2%80%AE%00")
        assert_problem(bad, 404, "run_not_found", "hostile run id")

    # Item: an admin's cross-tenant reads show the run's steps, events and dead letters,
    # exactly as the tenant itself sees them.
    with stack.client(submitter) as own, stack.client(token(tenant="ops", subject="root")) as admin:
        for run_id in ids.values():
            mine = _report(own, run_id).json()
            theirs = _report(admin, run_id, tenant="acme").json()
            assert theirs["steps"], f"admin report of {run_id} shows no steps"
            for section in ("steps", "events", "dead_letters"):
                assert theirs[section] == mine[section], section
            assert theirs["run"]["step_counts"] == mine["run"]["step_counts"]
            assert sum(theirs["run"]["step_counts"].values()) == len(theirs["steps"])
            text = _report(admin, run_id, tenant="acme", format="text").text
            assert f"== STEPS ({len(mine['steps'])}) ==" in text
            assert "(none)" not in text.split("== STEPS")[1].split("==")[1]
            for path in ("steps", "events"):
                a = admin.get(f"/runs/{run_id}/{path}", params={"tenant": "acme"}).json()
                b = own.get(f"/runs/{run_id}/{path}").json()
                assert a["items"] == b["items"] and a["items"], path
        dead = admin.get("/dead-letters", params={"tenant": "acme"}).json()["items"]
        assert {d["run_id"] for d in dead} == {
            ids["fid-hostile"],
            ids["fid-dag"],
            ids["fid-approve"],
        }
        # Without ?tenant= an admin token is its own tenant's: the run is not found.
        assert_problem(admin.get(f"/runs/{ids['fid-dag']}/report"), 404, "run_not_found")
