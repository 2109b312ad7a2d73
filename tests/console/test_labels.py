"""Run labels and the GET /runs filters over real HTTP (uvicorn + a worker process).

Both databases (the ``database_url`` fixture). Covers: labels at submit and their 422s
(one test per bad case), ``ctx.set_label`` through the worker process, children that
inherit labels, every new filter on ``GET /runs`` and ``GET /runs/counts``, unknown and
malformed filters, and the console's Runs and Run pages.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.acceptance.conftest import cli, cli_run
from tests.acceptance.conftest import token as dev_token
from tests.console.conftest import ConsoleStack
from tests.helpers import wait_for_sync


def _list(cs: ConsoleStack, **params: Any) -> list[dict[str, Any]]:
    with cs.api() as c:
        r = c.get("/runs", params=params)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def _ids(cs: ConsoleStack, **params: Any) -> set[str]:
    return {run["run_id"] for run in _list(cs, **params)}


def _refused(cs: ConsoleStack, path: str, body: Any = None, **params: Any) -> dict[str, Any]:
    with cs.api() as c:
        r = c.post(path, json=body) if body is not None else c.get(path, params=params)
    assert r.status_code == 422, r.text
    problem: dict[str, Any] = r.json()
    return problem


BAD_LABELS = [
    ({"": "x"}, "1..64"),
    ({"k" * 65: "x"}, "1..64"),
    ({"-lead": "x"}, "start with a letter"),
    ({"sp ace": "x"}, "A-Z a-z 0-9"),
    ({"k": ""}, "1..256"),
    ({"k": "v" * 257}, "1..256"),
    ({"k": "nul\u0000"}, "control"),
    ({"k": "zero\u200bwidth"}, "format"),
    ({"k": "bidi\u202e"}, "format"),
    ({"k": "e\u0301"}, "NFC"),
    ({"k": "star*"}, "'*'"),
    ({f"k{i}": "v" for i in range(17)}, "at most 16"),
    ({"k": 42}, ""),
]


def test_bad_labels_at_submit_are_422_and_create_nothing(console: ConsoleStack) -> None:
    # One stack for every case (each would otherwise start an API and a worker).
    for labels, message in BAD_LABELS:
        problem = _refused(
            console, "/runs", {"workflow": "con-echo", "input": {"text": "x"}, "labels": labels}
        )
        assert message in str(problem), (labels, problem)
    assert _ids(console, workflow="con-echo") == set()


def test_labels_at_submit_filters_and_counts(console: ConsoleStack) -> None:
    a = console.submit("con-echo", {"text": "a"}, labels={"customer": "42", "region": "eu-west"})
    b = console.submit("con-echo", {"text": "b"}, labels={"customer": "420", "region": "eu-east"})
    c = console.submit("con-fail", {"text": "c"}, labels={"customer": "7"})
    for run_id in (a, b):
        console.wait_status(run_id, "completed")
    console.wait_status(c, "failed")
    with console.api() as api:
        run = api.get(f"/runs/{a}").json()
        assert run["labels"] == {"customer": "42", "region": "eu-west"}
        report = api.get(f"/runs/{a}/report").json()
        assert report["run"]["labels"] == {"customer": "42", "region": "eu-west"}
        text = api.get(f"/runs/{a}/report.txt").text
        assert "labels       customer=42, region=eu-west" in text
    assert _ids(console, **{"label.customer": "42"}) == {a}
    assert _ids(console, **{"label.customer": "42*"}) == {a, b}
    assert _ids(console, **{"label.customer": "42", "label.region": "eu-west"}) == {a}
    assert _ids(console, **{"label.customer": "42", "label.region": "eu-east"}) == set()
    assert _ids(console, **{"label.region": "eu-*"}) == {a, b}
    assert _ids(console, **{"label.customer": "4*", "reason": "succeeded"}) == {a, b}
    assert _ids(console, reason="failure_non_retryable", **{"label.customer": "7"}) == {c}
    listed = _list(console, **{"label.customer": "42"})
    assert listed[0]["labels"]["region"] == "eu-west"
    version = listed[0]["version"]
    assert a in _ids(console, version=version, workflow="con-echo")
    assert _ids(console, version="no-such-version") == set()
    now = datetime.now(UTC)
    later = (now + timedelta(hours=1)).isoformat()
    earlier = (now - timedelta(hours=1)).isoformat()
    assert {a, b, c} <= _ids(console, finished_after=earlier, finished_before=later)
    assert _ids(console, finished_after=later) == set()
    with console.api() as api:
        counts = api.get("/runs/counts", params={"label.customer": "4*"}).json()
        assert counts["counts"]["completed"] == 2 and counts["total"] == 2
        counts = api.get("/runs/counts", params={"reason": "failure_non_retryable"}).json()
        assert counts["counts"]["failed"] == 1 and counts["total"] == 1


def test_label_filter_pages_keep_their_filters(console: ConsoleStack) -> None:
    made = {console.submit("con-echo", {"text": str(i)}, labels={"batch": "p1"}) for i in range(3)}
    console.submit("con-echo", {"text": "other"}, labels={"batch": "p2"})
    seen: set[str] = set()
    with console.api() as api:
        page = api.get("/runs", params={"label.batch": "p1", "limit": 2}).json()
        seen |= {r["run_id"] for r in page["items"]}
        token = page["next_page_token"]
        assert token
        rest = api.get(
            "/runs", params={"label.batch": "p1", "limit": 2, "page_token": token}
        ).json()
        seen |= {r["run_id"] for r in rest["items"]}
        assert rest["next_page_token"] is None
        # The token belongs to its filters: another label value is a 400, not a wrong page.
        other = api.get("/runs", params={"label.batch": "p2", "page_token": token})
        assert other.status_code == 400, other.text
    assert seen == made
    # The CLI: --label at start and in list (a real `treadle` process).
    env = {
        **console.stack.env,
        "TREADLE_URL": console.url,
        "TREADLE_TOKEN": dev_token(),
    }
    start = ["runs", "start", "con-echo", "--input", '{"text": "cli"}', "--label", "batch=p3"]
    started = json.loads(cli(env, *start, "-o", "json"))
    listed = json.loads(cli(env, "runs", "list", "--label", "batch=p3", "-o", "json"))
    assert [r["run_id"] for r in listed["items"]] == [started["run_id"]]
    assert listed["items"][0]["labels"] == {"batch": "p3"}
    listed = json.loads(cli(env, "runs", "list", "--all", "--label", "batch=p*", "-o", "json"))
    assert len(listed["items"]) == 5
    bad = cli_run(env, "runs", "list", "--label", "batch")
    assert bad.returncode == 2 and "key=value" in bad.stderr + bad.stdout
    bad = cli_run(env, "runs", "list", "--label", "bad key=1")
    assert bad.returncode == 1 and "A-Z a-z" in bad.stderr + bad.stdout


def test_set_label_in_a_worker_waiting_on_and_inherited_labels(console: ConsoleStack) -> None:
    parent = console.submit(
        "con-label",
        {"key": "order", "value": "A-1001", "child": True},
        labels={"customer": "42"},
    )

    def waiting() -> dict[str, Any] | None:
        # The child's end wakes its waiting parent (app/db/queries/runs.py wake_parent):
        # claimed again, the parent replays to the same wait, its waiting columns cleared
        # meanwhile. So the child is finished first, then the parent read waiting.
        children = [r for r in _list(console, **{"label.customer": "42"}) if r["run_id"] != parent]
        if not children or children[0]["status"] != "completed":
            return None
        with console.api() as api:
            run = api.get(f"/runs/{parent}").json()
        return run if run["waiting_on"] and run["labels"].get("order") else None

    run = wait_for_sync(waiting, timeout=90, what="the child done, the labelled run waits")
    assert run["labels"] == {"customer": "42", "order": "A-1001"}
    kind, name = run["waiting_on"]["kind"], run["waiting_on"]["name"]
    assert name == "go"
    # Bounded: a wake-up still due when the child ended may claim it once more (CI run 9
    # read the run waiting, then the list a moment later without it).
    wait_for_sync(
        lambda: (
            parent in _ids(console, waiting_on=f"{kind}:go")
            and parent in _ids(console, waiting_on=kind)
        ),
        timeout=30,
        what="the waiting run found by waiting_on=kind:name and by waiting_on=kind",
    )
    assert parent not in _ids(console, waiting_on=f"{kind}:other")
    with console.api() as api:
        steps = api.get(f"/runs/{parent}/steps").json()["items"]
    assert [s["name"] for s in steps if s["kind"] == "value"] == ["label"]
    children = [r for r in _list(console, **{"label.customer": "42"}) if r["run_id"] != parent]
    assert len(children) == 1
    assert children[0]["parent_run_id"] == parent
    assert children[0]["labels"] == {"customer": "42", "order": "A-1001"}
    # The child inherited the label set before it started: both found by it.
    assert _ids(console, **{"label.order": "A-1001"}) == {parent, children[0]["run_id"]}
    with console.api() as api:
        sent = api.post(f"/runs/{parent}/signals/go", json={"payload": 1})
        assert sent.status_code == 202, sent.text
    done = console.wait_status(parent, "completed")
    # The replay after the signal re-ran set_label from the journal: still one entry.
    assert done["labels"] == {"customer": "42", "order": "A-1001"}
    with console.api() as api:
        steps = api.get(f"/runs/{parent}/steps").json()["items"]
    assert [s["name"] for s in steps if s["kind"] == "value"] == ["label"]


MALFORMED = [
    ({"labels.customer": "42"}, "unknown filter"),
    ({"customer": "42"}, "unknown filter"),
    ({"label.": "42"}, "1..64"),
    ({"label.bad key": "42"}, "A-Z a-z"),
    ({"label.customer": ""}, "1..256"),
    ({"label.customer": "*"}, "1..256"),
    ({"label.customer": "4*2"}, "'*'"),
    ({"label.customer": "nul\u0000"}, "control"),
    ({"waiting_on": "Signal:go"}, "pattern"),
    ({"waiting_on": "signal:"}, "pattern"),
    ({"reason": "no_such_reason"}, "reason"),
    ({"version": "v\u0001"}, "control"),
    ({"finished_after": "yesterday"}, "finished_after"),
]


def test_malformed_filters_are_422(console: ConsoleStack) -> None:
    for params, message in MALFORMED:
        for path in ("/runs", "/runs/counts"):
            problem = _refused(console, path, **params)
            assert message in str(problem), (path, params, problem)


def test_repeated_label_filter_and_status_on_counts_are_422(console: ConsoleStack) -> None:
    with console.api() as api:
        r = api.get("/runs?label.customer=1&label.customer=2")
        assert r.status_code == 422 and "more than once" in r.text, r.text
        r = api.get("/runs/counts", params={"status": "completed"})
        assert r.status_code == 422 and "unknown filter" in r.text, r.text


def test_console_runs_page_filters_and_shows_labels(console: ConsoleStack) -> None:
    a = console.submit("con-echo", {"text": "a"}, labels={"customer": "42"})
    b = console.submit("con-echo", {"text": "b"}, labels={"customer": "43"})
    console.wait_status(a, "completed")
    console.wait_status(b, "completed")
    browser = console.browser(dev_token())
    page = browser.get("/ui/runs", params={"label": "customer=42"})
    assert page.status_code == 200, page.text
    assert a in page.text and b not in page.text
    assert "customer=42" in page.text
    page = browser.get("/ui/runs", params={"label": "customer=4*", "reason": "succeeded"})
    assert a in page.text and b in page.text
    page = browser.get("/ui/runs", params={"label": "not a label"})
    assert page.status_code == 200
    assert "key=value" in page.text
    run_page = browser.get(f"/ui/runs/{a}")
    assert run_page.status_code == 200
    assert "customer" in run_page.text and "42" in run_page.text
