"""The Runs and Run pages and the run actions (signal, cancel, resume, retry), over HTTP."""

from __future__ import annotations

from tests.console.conftest import ConsoleStack, alerts, tok
from tests.helpers import wait_for_sync


def _events(c: ConsoleStack, run_id: str) -> list[str]:
    with c.api() as api:
        return [e["kind"] for e in api.get(f"/runs/{run_id}/events").json()["items"]]


def test_run_page_signal_cancel_resume_retry(console: ConsoleStack) -> None:
    c = console
    b = c.browser(tok())
    run_id = c.submit("con-signal", {"text": "hello"}, idempotency_key="sig-1")
    c.wait_status(run_id, "waiting_signal")
    page = b.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200 and page.text.count("<h1>") == 1
    assert "waiting_signal" in page.text and "Waiting on" in page.text
    assert f'data-refresh="/ui/runs/{run_id}/live"' in page.text
    assert "<summary>Input</summary>" in page.text and "&#34;hello&#34;" in page.text
    assert "Text report" in page.text
    for button in ("Send signal", "Cancel run", "Resume"):
        assert f">{button}</button>" in page.text

    # Malformed JSON: a clear error, the form keeps what was typed, nothing is sent.
    bad = b.act(f"/ui/runs/{run_id}/signal", {"name": "go", "payload": '{"a": 1,'})
    assert bad.status_code == 400
    assert "not valid JSON" in alerts(bad.text)[0] and "nothing was sent" in alerts(bad.text)[0]
    assert "{&#34;a&#34;: 1," in bad.text
    # What the API itself would refuse is refused here, before anything is re-encoded:
    # a repeated key, NaN, a lone surrogate, nesting past the limit (tests/unit/test_json_text.py).
    for payload in ('{"a": 1, "a": 2}', '{"a": NaN}', '{"a": "\\ud800"}', "[" * 3000 + "]" * 3000):
        refused = b.act(f"/ui/runs/{run_id}/signal", {"name": "go", "payload": payload})
        assert refused.status_code == 400, refused.text
        assert "nothing was sent" in alerts(refused.text)[0], payload[:20]
    nameless = b.act(f"/ui/runs/{run_id}/signal", {"name": " ", "payload": "1"})
    assert nameless.status_code == 400 and "nothing was sent" in alerts(nameless.text)[0]
    assert "signal_received" not in _events(c, run_id)

    # Confirmation first: the first POST only asks.
    asked = b.act(f"/ui/runs/{run_id}/signal", {"name": "go", "payload": '{"n": 7}'}, confirm=False)
    assert asked.status_code == 200 and ">Send signal</button>" in asked.text
    assert "signal_received" not in _events(c, run_id)
    # A name the API refuses: its message, nothing sent.
    refused = b.act(f"/ui/runs/{run_id}/signal", {"name": "bad name!", "payload": "1"})
    shown = b.flash_after(refused)
    assert shown.startswith("Refused: ") and "signal_received" not in _events(c, run_id)
    sent = b.act(f"/ui/runs/{run_id}/signal", {"name": "go", "payload": '{"n": 7}'})
    assert "Signal 'go' sent" in b.flash_after(sent)
    c.wait_status(run_id, "completed")
    live = b.get(f"/ui/runs/{run_id}/live")
    assert live.status_code == 200 and "<html" not in live.text
    assert "completed" in live.text and "data-refresh-stop" in live.text
    assert "&#34;n&#34;: 7" in live.text  # the output, pretty-printed
    done = b.get(f"/ui/runs/{run_id}")
    assert "no actions apply" in done.text and ">Cancel run</button>" not in done.text
    # Acting on a finished run anyway: the API's refusal, shown.
    late = b.act(f"/ui/runs/{run_id}/cancel", {"reason": "too late"})
    assert b.flash_after(late).startswith("Refused: ")

    # Resume a waiting run, then cancel it with a reason.
    other = c.submit("con-signal", {"text": "other"})
    c.wait_status(other, "waiting_signal")
    assert "Run resumed" in b.flash_after(b.act(f"/ui/runs/{other}/resume", {}))
    assert "run_resumed" in _events(c, other)
    cancel_ask = b.act(f"/ui/runs/{other}/cancel", {"reason": "no longer needed"}, confirm=False)
    assert ">Cancel run</button>" in cancel_ask.text
    assert c.wait_status(other, "waiting_signal")  # still only asked
    assert "Run cancelled" in b.flash_after(
        b.act(f"/ui/runs/{other}/cancel", {"reason": "no longer needed"})
    )
    c.wait_status(other, "cancelled")

    # A failed run: its dead letter on the page, then Retry (reason required).
    failed = c.submit("con-fail", {"text": "boom"})
    c.wait_status(failed, "failed")
    page = b.get(f"/ui/runs/{failed}")
    assert ">Retry</button>" in page.text and "exploded: boom" in page.text
    assert "pending" in page.text  # the dead letter's status
    no_reason = b.act(f"/ui/runs/{failed}/retry", {"reason": ""})
    assert "Give a reason" in b.flash_after(no_reason)
    retried = b.act(f"/ui/runs/{failed}/retry", {"reason": "try again"})
    assert "Retry requested" in b.flash_after(retried)
    wait_for_sync(lambda: "dead_letter_requeued" in _events(c, failed), timeout=60, what="requeued")

    # The run id in the search box goes straight to the run; a key lists its run.
    to_run = b.get("/ui/runs", params={"q": run_id})
    assert to_run.status_code == 303 and to_run.headers["location"] == f"/ui/runs/{run_id}"
    by_key = b.get("/ui/runs", params={"q": "sig-1"})
    assert by_key.status_code == 200 and run_id in by_key.text and other not in by_key.text
    # An unknown run id is searched as a key: nothing matches.
    nothing = b.get("/ui/runs", params={"q": "00000000-0000-7000-8000-000000000000"})
    assert nothing.status_code == 200 and "No runs match." in nothing.text
    unknown = b.get("/ui/runs/00000000-0000-7000-8000-000000000000")
    assert unknown.status_code == 404 and "not found" in alerts(unknown.text)[0]


def test_runs_list_filters_counts_and_paging(console: ConsoleStack) -> None:
    c = console
    echo_ids = [c.submit("con-echo", {"text": f"e{i}"}, idempotency_key=f"k-{i}") for i in range(3)]
    failed = c.submit("con-fail", {"text": "x"})
    for run_id in echo_ids:
        c.wait_status(run_id, "completed")
    c.wait_status(failed, "failed")
    with c.api() as api:
        # API: idempotency_key filter and counts with the same filters.
        one = api.get("/runs", params={"idempotency_key": "k-1"}).json()
        assert [r["run_id"] for r in one["items"]] == [echo_ids[1]]
        assert api.get("/runs", params={"idempotency_key": "nope"}).json()["items"] == []
        counts = api.get("/runs/counts").json()
        assert counts["counts"]["completed"] == 3 and counts["counts"]["failed"] == 1
        assert counts["total"] == 4 and counts["counts"]["queued"] == 0
        assert api.get("/runs/counts", params={"workflow": "con-fail"}).json()["total"] == 1
        keyed = api.get("/runs/counts", params={"idempotency_key": "k-2"}).json()
        assert keyed["total"] == 1 and keyed["counts"]["completed"] == 1
        bad_key = api.get("/runs", params={"idempotency_key": "a\x00b"})
        assert bad_key.status_code == 422
        assert (
            api.get("/runs/counts", params={"created_after": "2026-01-01T00:00"}).status_code == 400
        )
        # Paging with the key filter: a token of one query is refused for another.
        first = api.get("/runs", params={"limit": 2}).json()
        assert len(first["items"]) == 2 and first["next_page_token"]
        rest = api.get("/runs", params={"limit": 2, "page_token": first["next_page_token"]})
        ids = [r["run_id"] for r in first["items"] + rest.json()["items"]]
        assert sorted(ids) == sorted([*echo_ids, failed])
        other_query = api.get(
            "/runs", params={"page_token": first["next_page_token"], "idempotency_key": "k-1"}
        )
        assert other_query.status_code == 400

    b = c.browser(tok())
    page = b.get("/ui/runs")
    assert page.status_code == 200
    assert "all: 4" in page.text and 'data-refresh="/ui/runs/table?' in page.text
    for run_id in [*echo_ids, failed]:
        assert run_id in page.text
    only_failed = b.get("/ui/runs", params={"status": "failed"})
    assert failed in only_failed.text and echo_ids[0] not in only_failed.text
    by_workflow = b.get("/ui/runs", params={"workflow": "con-echo"})
    assert failed not in by_workflow.text and all(r in by_workflow.text for r in echo_ids)
    future = b.get("/ui/runs", params={"created_after": "2999-01-01T00:00"})
    assert "No runs match." in future.text
    bad_time = b.get("/ui/runs", params={"created_after": "yesterday"})
    assert (
        bad_time.status_code == 200 and "Created after must be a date" in alerts(bad_time.text)[0]
    )
    bad_status = b.get("/ui/runs", params={"status": "sleeping"})
    assert alerts(bad_status.text)  # the API's 422, shown
    table = b.get("/ui/runs/table", params={"workflow": "con-echo"})
    assert table.status_code == 200 and "<html" not in table.text and echo_ids[0] in table.text
    # Paging through the console follows the API's token.
    assert "Next page" not in page.text


def test_run_page_shows_the_lines_the_run_logged(console: ConsoleStack) -> None:
    c = console
    b = c.browser(tok())
    run_id = c.submit("con-echo", {"text": "hi <b>there</b>"})
    c.wait_status(run_id, "completed")
    page = b.get(f"/ui/runs/{run_id}").text
    logs = page[page.index("<h2>Logs</h2>") : page.index("<h2>Timeline</h2>")]
    rows = logs.split('<tr class="log-')[1:]
    assert [r.split('"', 1)[0] for r in rows] == ["warning", "info", "info"]
    # Workflow lines have no step; the step's line names its step and attempt.
    assert "received hi &lt;b&gt;there&lt;/b&gt;" in rows[0] and "#" not in rows[0]
    assert "echo #1" in rows[1] and "echoing" in rows[1]
    assert "&#34;text&#34;: &#34;hi &lt;b&gt;there&lt;/b&gt;&#34;" in rows[1]
    assert "echoed" in rows[2] and "&#34;length&#34;: 15" in rows[2]
    assert "<b>there" not in page
    # The live fragment carries the same section.
    assert "<h2>Logs</h2>" in b.get(f"/ui/runs/{run_id}/live").text
    # A run that logged nothing says so.
    quiet = c.submit("con-signal", {"text": "quiet"})
    c.wait_status(quiet, "waiting_signal")
    assert "logged nothing with" in b.get(f"/ui/runs/{quiet}").text


def test_state_machine_transitions_are_listed(console: ConsoleStack) -> None:
    c = console
    run_id = c.submit("con-machine", {"text": "done"}, concurrency_key="lamp-1")
    c.wait_status(run_id, "completed")
    page = console.browser(tok()).get(f"/ui/runs/{run_id}")
    assert page.status_code == 200 and "State-machine transitions" in page.text
    assert "Red → Green" in page.text and "Green → Off" in page.text
    assert "<dt>State</dt><dd>Off</dd>" in page.text


def test_a_dag_run_page_draws_its_graph_with_each_node_status(console: ConsoleStack) -> None:
    c = console
    done = c.submit("con-dag", {"n": 2})
    broken = c.submit("con-dag", {"n": 2, "fail": True})
    c.wait_status(done, "completed")
    c.wait_status(broken, "failed")
    with c.api() as api:
        (dag,) = [w for w in api.get("/workflows").json()["items"] if w["name"] == "con-dag"]
    assert dag["versions"][0]["graph"] == [
        {"name": "split", "after": []},
        {"name": "count", "after": ["split"]},
        {"name": "weigh", "after": ["split"]},
        {"name": "total", "after": ["count", "weigh"]},
    ]
    browser = c.browser(tok())
    page = browser.get(f"/ui/runs/{done}").text
    assert '<svg class="dag"' in page and page.count('<line class="edge"') == 4
    for node in ("split", "count", "weigh", "total"):
        assert f'<g class="node s-succeeded" data-node="{node}">' in page
    page = browser.get(f"/ui/runs/{broken}").text
    assert '<g class="node s-failed" data-node="weigh">' in page
    assert '<g class="node s-succeeded" data-node="split">' in page
    # The join never ran: its node is drawn, without a step.
    assert '<g class="node s-pending" data-node="total">' in page
    # Other kinds have no graph.
    plain = c.submit("con-echo", {"text": "x"})
    c.wait_status(plain, "completed")
    assert '<svg class="dag"' not in browser.get(f"/ui/runs/{plain}").text


def test_run_page_pause_and_unpause(console: ConsoleStack) -> None:
    c = console
    b = c.browser(tok())
    run_id = c.submit("con-signal", {"text": "hold on"})
    c.wait_status(run_id, "waiting_signal")
    page = b.get(f"/ui/runs/{run_id}")
    assert ">Pause</button>" in page.text and ">Unpause</button>" not in page.text
    # Confirmation first: the first POST only asks.
    asked = b.act(f"/ui/runs/{run_id}/pause", {"reason": "adapter fix"}, confirm=False)
    assert asked.status_code == 200 and ">Pause run</button>" in asked.text
    assert "run_paused" not in _events(c, run_id)
    assert "Run paused" in b.flash_after(
        b.act(f"/ui/runs/{run_id}/pause", {"reason": "adapter fix"})
    )
    paused = b.get(f"/ui/runs/{run_id}")
    assert ">Unpause</button>" in paused.text and ">Pause</button>" not in paused.text
    assert "adapter fix" in paused.text and "takes no new step" in paused.text
    # A signal sent while paused is kept; the run stays waiting until unpaused.
    sent = b.act(f"/ui/runs/{run_id}/signal", {"name": "go", "payload": '{"n": 1}'})
    assert "Signal 'go' sent" in b.flash_after(sent)
    with c.api() as api:
        assert api.get(f"/runs/{run_id}").json()["status"] == "waiting_signal"
    again = b.act(f"/ui/runs/{run_id}/unpause", {}, confirm=False)
    assert ">Unpause</button>" in again.text and "run_unpaused" not in _events(c, run_id)
    assert "Run unpaused" in b.flash_after(b.act(f"/ui/runs/{run_id}/unpause", {}))
    c.wait_status(run_id, "completed")
    # Unpausing a run that is not paused: the API's refusal, shown.
    late = b.act(f"/ui/runs/{run_id}/unpause", {})
    assert b.flash_after(late).startswith("Refused: ")


def test_a_confirmation_refuses_fields_it_cannot_carry_back(console: ConsoleStack) -> None:
    r"""A reason with an invisible character is refused at the confirmation, not escaped.

    Pages escape invisible characters, hidden inputs included, so the confirmation used
    to post back ``a\u0000b`` as text and the retry was done with it (black-box session).
    """
    c = console
    b = c.browser(tok())
    failed = c.submit("con-fail", {"text": "boom"})
    c.wait_status(failed, "failed")
    for reason in ("a\x00b", "bidi\u202eoverride"):
        asked = b.act(f"/ui/runs/{failed}/retry", {"reason": reason}, confirm=False)
        assert asked.status_code == 422, asked.text[:500]
        assert "invisible characters" in alerts(asked.text)[0]
        assert ">Retry</button>" not in asked.text
    page = b.get(f"/ui/runs/{failed}")
    assert "failed" in page.text
    assert "dead_letter_requeued" not in _events(c, failed)
    # Line breaks and tabs are text a reason may hold.
    asked = b.act(f"/ui/runs/{failed}/retry", {"reason": "two\nlines\tok"}, confirm=False)
    assert asked.status_code == 200 and ">Retry</button>" in asked.text


def test_console_refuses_an_over_long_reason_whole_never_cut(console: ConsoleStack) -> None:
    """A reason over the API's limit is refused with an alert on every run action.

    The console used to cut it to 1000 characters: pause then succeeded with a truncated
    reason, and cancel's confirmation held the cut text (black-box session). The limit is
    the API's own (``app.core.limits``); one character less is taken as is.
    """
    from app.core.limits import MAX_ACTION_REASON

    c = console
    b = c.browser(tok())
    waiting = c.submit("con-signal", {"text": "long reason"})
    failed = c.submit("con-fail", {"text": "boom"})
    c.wait_status(waiting, "waiting_signal")
    c.wait_status(failed, "failed")
    too_long = "r" * (MAX_ACTION_REASON + 1)
    for run_id, verb in ((waiting, "pause"), (waiting, "cancel"), (failed, "retry")):
        for confirm in (False, True):
            page = b.act(f"/ui/runs/{run_id}/{verb}", {"reason": too_long}, confirm=confirm)
            assert page.status_code == 422, (verb, page.status_code)
            assert page.headers["content-type"].startswith("text/html")
            (alert,) = alerts(page.text)
            assert f"at most {MAX_ACTION_REASON} characters" in alert, alert
            assert "r" * 1000 not in page.text  # no confirmation carrying a cut copy
    kinds = _events(c, waiting) + _events(c, failed)
    assert not {"run_paused", "run_cancelled", "dead_letter_requeued"} & set(kinds)
    with c.api() as api:
        assert api.get(f"/runs/{waiting}").json()["status"] == "waiting_signal"
        dead = api.get("/dead-letters").json()["items"]
    assert dead, "the failed run has a dead letter"
    dl_id = dead[0]["dead_letter_id"] if "dead_letter_id" in dead[0] else dead[0]["id"]
    page = b.act(f"/ui/dead-letters/{dl_id}/requeue", {"reason": too_long}, confirm=False)
    assert page.status_code == 422 and alerts(page.text)
    # At the limit exactly: taken whole.
    at_limit = "p" * MAX_ACTION_REASON
    assert "Run paused" in b.flash_after(b.act(f"/ui/runs/{waiting}/pause", {"reason": at_limit}))
    assert at_limit in b.get(f"/ui/runs/{waiting}").text
