"""Submitting, listing, waiting, reporting and cancelling over real HTTP.

Against a real ``treadle serve`` process on both databases: idempotency keys (body field
and ``Idempotency-Key`` header) including 50 concurrent retries, keyset pagination that
stays stable under concurrent inserts, filters, ``/result`` long-polling before and after
a real worker runs the run, the operator's report (JSON and text) and cancellation.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import httpx

from tests.acceptance.conftest import Stack, token
from tests.acceptance.test_http_input import (
    assert_problem,
    client,
    describe,
    list_run_ids,
    register_workflows,
    wait_result,
)

BURST = 50
REPORT_SECTIONS = ["== RUN ==", "== STEPS", "== TIMELINE", "== LOGS", "== DEAD LETTERS"]


def test_submit_list_wait_report_and_cancel(stack: Stack) -> None:
    # No worker yet: definitions are registered as a starting worker would, so runs stay
    # queued until check_result_report_and_cancel starts a real worker.
    register_workflows(stack)
    check_idempotency(stack, tenant="idem")
    check_concurrent_identical_retries(stack, tenant="burst")
    check_concurrent_conflicting_retries(stack, tenant="clash")
    check_listing(stack, tenant="lister")
    check_result_report_and_cancel(stack, tenant="ops")


# --- idempotency --------------------------------------------------------------------------


def check_idempotency(stack: Stack, tenant: str) -> None:
    """What counts as "the same request" for an idempotency key.

    Asserted contract: same key + identical request -> 201 then 200 with the same run (and
    the same ``Location``); the key may come in the body or in the ``Idempotency-Key``
    header interchangeably; the same key with a different input, delay or concurrency key
    -> 409 ``idempotency_key_reused`` naming the original run. The version is compared as
    given: ``1`` and ``"1"`` are the same request, but omitting the version is not the same
    as pinning ``"1"`` (even though 1 is the latest). An unregistered version is 404 before
    any idempotency check. Keys are per tenant.
    """
    first_body: dict[str, Any] = {
        "workflow": "acc-echo",
        "input": {"value": "a"},
        "idempotency_key": "order-1",
    }
    with client(stack, token(tenant=tenant)) as c:
        first = c.post("/runs", json=first_body)
        assert first.status_code == 201, describe(first)
        run = first.json()
        assert first.headers["location"] == f"/runs/{run['run_id']}"
        assert run["idempotency_key"] == "order-1"
        again = c.post("/runs", json=first_body)
        assert again.status_code == 200, describe(again)
        assert again.json() == run, "an idempotent retry must return the very same run"
        assert again.headers["location"] == f"/runs/{run['run_id']}"

        # The header is the same key as the body field.
        by_header = {"workflow": "acc-echo", "input": {"value": "b"}}
        created = c.post("/runs", json=by_header, headers={"Idempotency-Key": "order-2"})
        assert created.status_code == 201, describe(created)
        header_run = created.json()
        assert header_run["idempotency_key"] == "order-2"
        retries = [
            ("header again", by_header, {"Idempotency-Key": "order-2"}),
            ("key in the body instead", {**by_header, "idempotency_key": "order-2"}, {}),
            (
                "both, equal",
                {**by_header, "idempotency_key": "order-2"},
                {"Idempotency-Key": "order-2"},
            ),
        ]
        for what, body, headers in retries:
            resp = c.post("/runs", json=body, headers=headers)
            assert resp.status_code == 200, f"[{what}] {describe(resp)}"
            assert resp.json()["run_id"] == header_run["run_id"], what
            assert resp.headers["location"] == f"/runs/{header_run['run_id']}", what

        resp = c.post(
            "/runs",
            json={**by_header, "idempotency_key": "order-2"},
            headers={"Idempotency-Key": "other"},
        )
        assert_problem(resp, 400, "bad_request", "header and body keys differ")
        resp = c.post("/runs", json=by_header, headers={"Idempotency-Key": "k" * 256})
        problem = assert_problem(resp, 422, "invalid_request", "256-character header key")
        assert [e["path"] for e in problem["errors"]] == ["header.Idempotency-Key"], problem

        conflicts: list[tuple[str, dict[str, Any]]] = [
            ("different input", {**first_body, "input": {"value": "changed"}}),
            ("added delay", {**first_body, "delay": 5}),
            ("added concurrency key", {**first_body, "concurrency_key": "c"}),
            ("pinned version (was unpinned)", {**first_body, "version": "1"}),
            ("different workflow", {**first_body, "workflow": "acc-hold", "input": {"name": "x"}}),
        ]
        for what, body in conflicts:
            resp = c.post("/runs", json=body)
            problem = assert_problem(resp, 409, "idempotency_key_reused", what)
            assert problem["run_id"] == run["run_id"], f"[{what}] {problem}"

        pinned = {
            "workflow": "acc-echo",
            "input": {"value": "c"},
            "version": "1",
            "idempotency_key": "order-3",
        }
        resp = c.post("/runs", json=pinned)
        assert resp.status_code == 201, describe(resp)
        pinned_id = resp.json()["run_id"]
        resp = c.post("/runs", json={**pinned, "version": 1})
        assert (resp.status_code, resp.json()["run_id"]) == (200, pinned_id), describe(resp)
        resp = c.post("/runs", json={**pinned, "version": "2"})
        assert_problem(resp, 404, "workflow_not_found", "unregistered version")

    with client(stack, token(tenant="elsewhere")) as c:
        resp = c.post("/runs", json=first_body)
        assert resp.status_code == 201, f"keys are per tenant: {describe(resp)}"
        assert resp.json()["run_id"] != run["run_id"]

    assert sorted(list_run_ids(stack, tenant)) == sorted(
        [run["run_id"], header_run["run_id"], pinned_id]
    )


# --- concurrent retries -------------------------------------------------------------------


async def _burst(stack: Stack, tenant: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """POST every body at once, each over its own connection."""
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=stack.url,
        headers={"Authorization": f"Bearer {token(tenant=tenant)}"},
        timeout=60,
        limits=limits,
    ) as c:
        return list(await asyncio.gather(*(c.post("/runs", json=b) for b in bodies)))


def check_concurrent_identical_retries(stack: Stack, tenant: str) -> None:
    """50 identical keyed submissions at once: one run, one 201, 49 x 200, one run id."""
    body = {"workflow": "acc-echo", "input": {"value": "same"}, "idempotency_key": "burst"}
    responses = asyncio.run(_burst(stack, tenant, [body] * BURST))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * (BURST - 1) + [201], [
        describe(r) for r in responses if r.status_code not in (200, 201)
    ]
    run_ids = {r.json()["run_id"] for r in responses}
    assert len(run_ids) == 1, f"{len(run_ids)} different runs: {run_ids}"
    assert list_run_ids(stack, tenant) == list(run_ids)


def check_concurrent_conflicting_retries(stack: Stack, tenant: str) -> None:
    """50 submissions at once, one key, 50 inputs: one run, one 201, 49 x 409 naming it."""
    bodies = [
        {"workflow": "acc-echo", "input": {"value": i}, "idempotency_key": "clash"}
        for i in range(BURST)
    ]
    responses = asyncio.run(_burst(stack, tenant, bodies))
    winners = [r for r in responses if r.status_code == 201]
    assert len(winners) == 1, sorted(r.status_code for r in responses)
    winner = winners[0].json()
    for r in responses:
        if r is not winners[0]:
            problem = assert_problem(r, 409, "idempotency_key_reused", "concurrent clash")
            assert problem["run_id"] == winner["run_id"], problem
    assert list_run_ids(stack, tenant) == [winner["run_id"]]
    with client(stack, token(tenant=tenant)) as c:
        stored = c.get(f"/runs/{winner['run_id']}").json()
    assert stored["input"] == winner["input"], "the stored input is not the winner's"


# --- listing ------------------------------------------------------------------------------


def _ids(page: dict[str, Any]) -> list[str]:
    return [str(r["run_id"]) for r in page["items"]]


def check_listing(stack: Stack, tenant: str) -> None:
    """Keyset pages: newest first, no duplicates, stable under inserts; filters."""
    holds = {1, 4}
    with client(stack, token(tenant=tenant)) as c:

        def submit(i: int) -> str:
            # Delayed: the worker started later in this test must leave these alone.
            body: dict[str, Any] = (
                {"workflow": "acc-hold", "input": {"name": f"list-{i}"}}
                if i in holds
                else {"workflow": "acc-echo", "input": {"value": i}}
            )
            resp = c.post("/runs", json={**body, "delay": 3600})
            assert resp.status_code == 201, describe(resp)
            return str(resp.json()["run_id"])

        original = [submit(i) for i in range(7)]
        newest_first = original[::-1]

        def page(params: dict[str, Any]) -> dict[str, Any]:
            resp = c.get("/runs", params=params)
            assert resp.status_code == 200, describe(resp)
            body: dict[str, Any] = resp.json()
            return body

        p1 = page({"limit": 3})
        late = [submit(i) for i in range(7, 9)]  # inserted mid-pagination
        p2 = page({"limit": 3, "page_token": p1["next_page_token"]})
        p3 = page({"limit": 3, "page_token": p2["next_page_token"]})
        assert [len(p["items"]) for p in (p1, p2, p3)] == [3, 3, 1]
        assert p3["next_page_token"] is None
        assert _ids(p1) + _ids(p2) + _ids(p3) == newest_first, (
            "pagination must return each original run exactly once, newest first, and none "
            "of the runs inserted while paging"
        )
        everything = page({"limit": 200})
        assert _ids(everything) == late[::-1] + newest_first
        stamps = [datetime.fromisoformat(r["created_at"]) for r in everything["items"]]
        assert stamps == sorted(stamps, reverse=True), "not newest first by created_at"

        # Filters (and paging under a filter).
        hold_ids = [original[i] for i in sorted(holds, reverse=True)]
        echo_ids = [r for r in late[::-1] + newest_first if r not in hold_ids]
        assert _ids(page({"workflow": "acc-hold"})) == hold_ids
        paged: list[str] = []
        params: dict[str, Any] = {"workflow": "acc-echo", "limit": 2}
        while True:
            p = page(params)
            paged += _ids(p)
            if p["next_page_token"] is None:
                break
            params["page_token"] = p["next_page_token"]
            replay = c.get("/runs", params={"limit": 2, "page_token": p["next_page_token"]})
            assert_problem(replay, 400, "bad_request", "filtered page_token without its filter")
        assert paged == echo_ids

        cancelled = [original[1], original[2]]  # one acc-hold, one acc-echo
        for run_id in cancelled:
            resp = c.post(f"/runs/{run_id}/cancel")
            assert resp.status_code == 200, describe(resp)
        assert set(_ids(page({"status": "cancelled"}))) == set(cancelled)
        assert _ids(page({"status": "cancelled"})) == cancelled[::-1]
        assert _ids(page({"status": "queued"})) == [
            r for r in _ids(everything) if r not in cancelled
        ]
        assert _ids(page({"workflow": "acc-hold", "status": "cancelled"})) == [original[1]]
        assert _ids(page({"status": "completed"})) == []
        assert _ids(page({"workflow": "no-such-flow"})) == []
        assert _ids(page({"created_after": "2000-01-01T00:00:00Z"})) == _ids(everything)
        assert _ids(page({"created_before": "2000-01-01T00:00:00Z"})) == []


# --- result, report, cancel -----------------------------------------------------------------


def check_result_report_and_cancel(stack: Stack, tenant: str) -> None:
    with client(stack, token(tenant=tenant)) as c:
        resp = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": "finish me"}})
        assert resp.status_code == 201, describe(resp)
        run_id = str(resp.json()["run_id"])

        # No worker is running: the result is not ready, after waiting or not.
        started = time.monotonic()
        pending = c.get(f"/runs/{run_id}/result", params={"wait": 0.5})
        assert time.monotonic() - started >= 0.5, "?wait=0.5 returned before 0.5 s"
        assert pending.status_code == 202, describe(pending)
        assert pending.json() == {
            "run_id": run_id,
            "done": False,
            "status": "queued",
            "reason": None,
            "output": None,
            "error": None,
        }
        assert c.get(f"/runs/{run_id}/result").status_code == 202

        # Cancel a queued run; cancelling again is a no-op returning the same run.
        resp = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": "cancel me"}})
        assert resp.status_code == 201, describe(resp)
        victim = str(resp.json()["run_id"])
        first = c.post(f"/runs/{victim}/cancel", json={"reason": "no longer needed"})
        assert first.status_code == 200, describe(first)
        cancelled = first.json()
        assert (cancelled["status"], cancelled["reason"]) == ("cancelled", "canceled_by_request")
        assert cancelled["finished_at"] is not None
        second = c.post(f"/runs/{victim}/cancel", json={"reason": "again"})
        assert second.status_code == 200, describe(second)
        assert second.json() == cancelled, "a second cancel must change nothing"
        third = c.post(f"/runs/{victim}/cancel")  # the body is optional
        assert third.status_code == 200 and third.json() == cancelled, describe(third)
        events = c.get(f"/runs/{victim}/events").json()["items"]
        cancels = [e for e in events if e["kind"] == "run_cancelled"]
        assert len(cancels) == 1, events
        assert cancels[0]["actor"] == "alice"
        assert cancels[0]["data"] == {"reason": "no longer needed"}
        result = c.get(f"/runs/{victim}/result")
        assert result.status_code == 200, describe(result)
        assert (result.json()["done"], result.json()["status"]) == (True, "cancelled")
        bad = c.post(f"/runs/{victim}/cancel", json={"reason": 5})
        assert_problem(bad, 422, "invalid_request", "cancel reason not a string")

    # A worker arrives and finishes the first run (the cancelled one stays cancelled).
    stack.start_worker(concurrency=2)
    done = wait_result(stack, tenant, run_id)
    assert (done["status"], done["reason"], done["output"]) == (
        "completed",
        "succeeded",
        "finish me",
    ), done
    with client(stack, token(tenant=tenant)) as c:
        final = c.get(f"/runs/{run_id}/result")
        assert final.status_code == 200 and final.json()["done"] is True, describe(final)
        assert c.get(f"/runs/{victim}").json()["status"] == "cancelled"

        # Too late to cancel a run that finished otherwise: 409, and nothing changes.
        before = c.get(f"/runs/{run_id}").json()
        events_before = c.get(f"/runs/{run_id}/events").json()["items"]
        late = c.post(f"/runs/{run_id}/cancel", json={"reason": "too late"})
        problem = assert_problem(late, 409, "run_finished", "cancel a completed run")
        assert problem["status"] == 409, "error data must not override the problem's status"
        assert c.get(f"/runs/{run_id}").json() == before
        assert c.get(f"/runs/{run_id}/events").json()["items"] == events_before

        check_report(c, run_id)


def check_report(c: httpx.Client, run_id: str) -> None:
    resp = c.get(f"/runs/{run_id}/report")
    assert resp.status_code == 200, describe(resp)
    assert resp.headers["content-type"].startswith("application/json")
    report = resp.json()
    assert set(report) == {
        "run",
        "steps",
        "events",
        "events_truncated",
        "dead_letters",
        "logs",
        "logs_total",
        "generated_at",
    }, report.keys()
    assert report["run"]["run_id"] == run_id and report["run"]["status"] == "completed"
    assert report["run"]["step_counts"] == {"succeeded": 1}
    assert [(s["step_id"], s["status"]) for s in report["steps"]] == [("echo_value", "succeeded")]
    kinds = [e["kind"] for e in report["events"]]
    assert kinds[0] == "run_submitted" and kinds[-1] == "run_completed", kinds
    assert report["events_truncated"] is False
    assert report["dead_letters"] == []
    # events_limit keeps the first N events and says the timeline was cut.
    first = c.get(f"/runs/{run_id}/report", params={"events_limit": 1}).json()
    assert [e["kind"] for e in first["events"]] == ["run_submitted"]
    assert first["events_truncated"] is True
    exact = c.get(f"/runs/{run_id}/report", params={"events_limit": len(kinds)}).json()
    assert (exact["events"], exact["events_truncated"]) == (report["events"], False)
    assert datetime.fromisoformat(report["generated_at"]) >= datetime.fromisoformat(
        report["run"]["finished_at"]
    )

    for what, params, headers in [
        ("?format=text", {"format": "text"}, {}),
        ("Accept: text/plain", {}, {"Accept": "text/plain"}),
    ]:
        resp = c.get(f"/runs/{run_id}/report", params=params, headers=headers)
        assert resp.status_code == 200, f"[{what}] {describe(resp)}"
        assert resp.headers["content-type"].startswith("text/plain"), what
        positions = [resp.text.find(section) for section in REPORT_SECTIONS]
        assert -1 not in positions and positions == sorted(positions), (
            f"[{what}] sections missing or out of order: {resp.text}"
        )
        assert run_id in resp.text and "echo_value" in resp.text, what
    explicit = c.get(
        f"/runs/{run_id}/report", params={"format": "json"}, headers={"Accept": "text/plain"}
    )
    assert explicit.headers["content-type"].startswith("application/json"), "format wins"
    assert_problem(
        c.get(f"/runs/{run_id}/report", params={"format": "xml"}),
        422,
        "invalid_request",
        "unknown report format",
    )
