"""app.client against a live ``treadle serve`` and real worker processes, both databases.

The sync client walks the whole operator surface (submit, get, result, execute, list and
its pages, signals, approvals, cancel, resume, retry, reports, dead letters); the async
client the same core; errors are checked to arrive as one ``TreadleAPIError`` with the
problem's members, ids with ``/``, ``?``, ``#`` reaching the route they were meant for.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from app.client import (
    AsyncTreadleClient,
    RunFailed,
    RunNotFinished,
    TreadleAPIError,
    TreadleClient,
    TreadleUnreachable,
)
from app.core.status import RunReason, RunStatus
from tests.acceptance.conftest import Stack, free_port, token
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

# Several server and worker processes (and CLI interpreters) start on a loaded machine.
pytestmark = pytest.mark.timeout(600)


def test_sync_client_covers_the_operator_surface(stack: Stack) -> None:
    stack.start_worker()
    with TreadleClient(stack.url, token()) as api:
        # execute: submit + wait, typed result.
        value = {"greeting": "héllo", "n": [1, 2, 3]}
        done = api.execute("acc-echo", {"value": value}, timeout=60)
        assert done.succeeded and done.reason is RunReason.SUCCEEDED
        assert done.output == value

        # submit is idempotent with a key; get/result see the same run.
        first = api.submit("acc-echo", {"value": 1}, idempotency_key="client-1")
        again = api.submit("acc-echo", {"value": 1}, idempotency_key="client-1")
        assert again.run_id == first.run_id and first.status is RunStatus.QUEUED
        assert api.get(first.run_id).workflow == "acc-echo"
        assert api.result(first.run_id, wait=60).output == 1

        # A failed run: execute raises RunFailed carrying the result, or returns it.
        with pytest.raises(RunFailed) as failed:
            api.execute("acc-fail", {"name": "sync"}, timeout=60)
        bad = failed.value.result
        assert (bad.status, bad.reason) == (RunStatus.FAILED, RunReason.FAILURE_NON_RETRYABLE)
        assert "sync is refused" in str(bad.error)
        soft = api.execute("acc-fail", {"name": "soft"}, timeout=60, check=False)
        assert not soft.succeeded and soft.status is RunStatus.FAILED

        # Reports: JSON (typed) and text.
        report = api.report(bad.run_id)
        assert report.run.run_id == bad.run_id and report.dead_letters
        text = api.report_text(bad.run_id)
        assert str(bad.run_id) in text and "acc-fail" in text

        # Dead letters: list (and every page), requeue, retry.
        pending = {d.run_id for d in api.dead_letters(limit=200).items}
        assert {bad.run_id, soft.run_id} <= pending
        assert {d.run_id for d in api.dead_letters_all(page_size=1)} == pending
        letter = next(d for d in api.dead_letters().items if d.run_id == bad.run_id)
        requeued = api.requeue(letter.dead_letter_id, reason="fixed", correlation_id="INC-1")
        assert requeued.status == "requeued" and requeued.correlation_id == "INC-1"
        retried = api.retry(soft.run_id, reason="try again")
        assert retried.run_id == soft.run_id and retried.status == "requeued"
        with pytest.raises(TreadleAPIError) as twice:
            api.requeue(letter.dead_letter_id, reason="again")
        assert twice.value.status == 409

        # Paging: pages of 2 cover every run exactly once; list_all walks them.
        created = [api.submit("acc-echo", {"value": i}).run_id for i in range(5)]
        seen: list[uuid.UUID] = []
        page = api.list(workflow="acc-echo", limit=2)
        while True:
            assert len(page.items) <= 2
            seen += [r.run_id for r in page.items]
            if page.next_page_token is None:
                break
            page = api.list(workflow="acc-echo", limit=2, page_token=page.next_page_token)
        assert len(seen) == len(set(seen)) and set(created) <= set(seen)
        assert [r.run_id for r in api.list_all(workflow="acc-echo", page_size=2)] == seen
        future = datetime.now(UTC) + timedelta(days=1)
        assert api.list(created_after=future).items == []

        # Approvals, signals, resume and cancel on a waiting run.
        approver = DevTokens(DEV_SECRET).mint(
            tenant_id="acme", subject="maria", scopes=ALL_SCOPES, groups=["sales-manager"]
        )
        waiting = api.submit("acc-approve", {"name": "c1"})
        wait_for_sync(
            lambda: api.get(waiting.run_id).status is RunStatus.WAITING_APPROVAL,
            timeout=60,
            what="run waits for its approval",
        )
        assert api.resume(waiting.run_id).run_id == waiting.run_id
        with TreadleClient(stack.url, approver) as boss:
            decided = boss.approve(waiting.run_id, "manager", comment="ok")
        assert decided.resolved and decided.decided_by == "maria"
        accepted = api.signal(waiting.run_id, "docs_uploaded", {"files": ["id.pdf"]})
        assert accepted.name == "docs_uploaded"
        finished = api.wait(waiting.run_id, timeout=60)
        assert finished.output["docs"] == {"files": ["id.pdf"]}

        doomed = api.submit("acc-approve", {"name": "c2"})
        cancelled = api.cancel(doomed.run_id, reason="no longer needed")
        assert cancelled.status in {RunStatus.CANCELLING, RunStatus.CANCELLED}
        with pytest.raises(RunFailed) as ended:
            api.wait(doomed.run_id, timeout=60)
        assert ended.value.result.reason is RunReason.CANCELED_BY_REQUEST

        # wait(timeout=) gives up on a run that stays open.
        parked = api.submit("acc-approve", {"name": "c3"})
        with pytest.raises(RunNotFinished) as open_:
            api.wait(parked.run_id, timeout=0.5)
        assert not open_.value.result.done


def test_errors_are_one_type_with_the_problem_members(stack: Stack) -> None:
    with TreadleClient(stack.url, token()) as api:
        with pytest.raises(TreadleAPIError) as missing:
            api.get(uuid.uuid4())
        err = missing.value
        assert (err.status, err.code, err.title) == (404, "run_not_found", "Not Found")
        assert "not found" in err.detail

        # Ids are one path segment: "?", "#", "%" and spaces cannot turn into a query,
        # a fragment or another id; the run route itself answers run_not_found.
        for hostile in ("x?wait=5", "y#frag", "%2F", "é ü", "a;b", "..."):
            with pytest.raises(TreadleAPIError) as quoted:
                api.result(hostile)
            assert (quoted.value.status, quoted.value.code) == (404, "run_not_found"), hostile
        # A "/" is quoted too, but the server decodes %2F before routing: no run route
        # matches, and the answer is a plain 404 (never another route's answer).
        for hostile in ("a/b", "../dead-letters"):
            with pytest.raises(TreadleAPIError) as slashed:
                api.result(hostile)
            assert slashed.value.status == 404, hostile

        with pytest.raises(TreadleAPIError) as unknown:
            api.submit("no-such-workflow", {})
        assert unknown.value.code == "workflow_not_found"

        with pytest.raises(TreadleAPIError) as invalid:
            api.list(limit=1000)
        assert invalid.value.status == 422 and invalid.value.problem["errors"]

    with TreadleClient(stack.url, "not-a-token") as anonymous:
        with pytest.raises(TreadleAPIError) as refused:
            anonymous.workflows()
        assert refused.value.status == 401

    with TreadleClient(f"http://127.0.0.1:{free_port()}", token()) as nowhere:
        with pytest.raises(TreadleUnreachable) as down:
            nowhere.get(uuid.uuid4())
        assert down.value.code == "server_unreachable" and down.value.status is None
        assert isinstance(down.value, TreadleAPIError)


async def test_async_client_core(stack: Stack) -> None:
    stack.start_worker()
    async with AsyncTreadleClient(stack.url, token()) as api:
        done = await api.execute("acc-echo", {"value": {"a": [1, None]}}, timeout=60)
        assert done.succeeded and done.output == {"a": [1, None]}
        with pytest.raises(RunFailed) as failed:
            await api.execute("acc-fail", {"name": "async"}, timeout=60)
        run_id = failed.value.result.run_id
        assert (await api.get(run_id)).status is RunStatus.FAILED
        assert str(run_id) in await api.report_text(run_id)
        assert (await api.report(run_id)).dead_letters
        ids = [r.run_id async for r in api.list_all(page_size=1)]
        assert {done.run_id, run_id} <= set(ids) and len(ids) == len(set(ids))
        letters = [d.run_id async for d in api.dead_letters_all(page_size=1)]
        assert run_id in letters
        with pytest.raises(TreadleAPIError) as missing:
            await api.cancel("x?y#z")
        assert missing.value.code == "run_not_found"
        assert [w.name for w in (await api.workflows()).items if w.name == "acc-echo"]
