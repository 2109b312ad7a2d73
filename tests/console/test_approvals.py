"""The approvals inbox and GET /approvals: only decidable approvals, the API's own rules."""

from __future__ import annotations

from typing import Any

from tests.console.conftest import ConsoleStack, alerts, tok


def _inbox_api(c: ConsoleStack, token: str) -> list[dict[str, Any]]:
    with c.api(token) as api:
        r = api.get("/approvals")
        assert r.status_code == 200, r.text
        items: list[dict[str, Any]] = r.json()["items"]
        return items


def test_inbox_lists_only_decidable_approvals_and_decides_them(console: ConsoleStack) -> None:
    c = console
    alice = tok(subject="alice", groups=("finance",))  # submits every run
    bob = tok(subject="bob", groups=("finance",))
    carol = tok(subject="carol", groups=("finance", "legal"))
    finance = c.submit("con-approve", {"group": "finance", "note": "pay"}, alice)
    anyone = c.submit("con-approve", {"note": "anyone"}, alice)
    legal = c.submit("con-approve", {"group": "legal", "note": "law"}, alice)
    two = c.submit("con-approve", {"group": "finance", "approvals": 2, "note": "two"}, alice)
    for run_id in (finance, anyone, legal, two):
        c.wait_status(run_id, "waiting_approval")

    # API: bob sees finance and group-less approvals, never legal's.
    items = _inbox_api(c, bob)
    by_run = {i["run_id"]: i for i in items}
    assert set(by_run) == {finance, anyone, two}
    pay = by_run[finance]
    assert pay["payload"] == {"note": "pay"} and pay["group"] == "finance"
    assert pay["remaining"] == 1 and pay["approvals_needed"] == 1 and pay["deadline"] is None
    assert pay["submitted_by"] == "alice" and pay["self_approval"] is False
    assert by_run[two]["approvals_needed"] == 2 and by_run[two]["remaining"] == 2
    assert {i["run_id"] for i in _inbox_api(c, carol)} == {finance, anyone, legal, two}
    # Paging: one at a time, oldest first, every item once.
    with c.api(carol) as api:
        seen, token = [], None
        while True:
            params: dict[str, Any] = {"limit": 1}
            if token:
                params["page_token"] = token
            page = api.get("/approvals", params=params).json()
            seen += [i["run_id"] for i in page["items"]]
            token = page["next_page_token"]
            if not token:
                break
        # The unpaged order (oldest waiting step first; the worker may reach the four
        # approvals in any order), each item exactly once.
        whole = [i["run_id"] for i in api.get("/approvals").json()["items"]]
        assert seen == whole and sorted(seen) == sorted([finance, anyone, legal, two])
        assert api.get("/approvals", params={"page_token": "garbage"}).status_code == 400
    # Deciding needs approvals:write, and so does the inbox.
    with c.api(tok(subject="dave", scopes=["runs:read"])) as api:
        assert api.get("/approvals").status_code == 403

    # The console's inbox shows the same, with its payload and forms.
    b = c.browser(bob)
    page = b.get("/ui/approvals")
    assert page.status_code == 200 and page.text.count("<h1>") == 1
    assert finance in page.text and anyone in page.text and legal not in page.text
    assert ">Approve</button>" in page.text and ">Reject</button>" in page.text
    assert "1 more of 1 approval" in page.text and "2 more of 2 approvals" in page.text

    # Self-approval: alice sees her run (her group) and is refused in the API's words.
    a = c.browser(alice)
    own = a.get("/ui/approvals").text
    assert finance in own
    # Every run here is hers and none allows self-approval: each card says who must
    # decide it, and no button offers a decision the API would refuse.
    assert "a member of finance must decide it" in own and "someone else must decide it" in own
    assert ">Approve</button>" not in own and ">Reject</button>" not in own
    refused = a.act(
        "/ui/approvals/decide",
        {"run_id": finance, "step_id": pay["step_id"], "decision": "approve"},
    )
    shown = a.flash_after(refused)
    with c.api(alice) as api:
        direct = api.post(
            f"/runs/{finance}/approvals/{pay['step_id']}", json={"decision": "approve"}
        )
    assert direct.status_code == 403
    assert shown == f"Refused: {direct.json()['detail']}"
    assert "may not decide" in shown

    # Wrong group, forced through the form: the API's 403 message.
    legal_step = {i["run_id"]: i for i in _inbox_api(c, carol)}[legal]["step_id"]
    wrong = b.act(
        "/ui/approvals/decide", {"run_id": legal, "step_id": legal_step, "decision": "approve"}
    )
    assert "needs a member of group 'legal'" in b.flash_after(wrong)

    # Approve with a comment, after the confirmation page.
    ask = b.act(
        "/ui/approvals/decide",
        {"run_id": finance, "step_id": pay["step_id"], "decision": "approve", "comment": "ok"},
        confirm=False,
    )
    assert ask.status_code == 200 and ">Approve</button>" in ask.text
    assert c.wait_status(finance, "waiting_approval")  # asked only
    done = b.act(
        "/ui/approvals/decide",
        {"run_id": finance, "step_id": pay["step_id"], "decision": "approve", "comment": "ok"},
    )
    assert "Approved" in b.flash_after(done)
    assert c.wait_status(finance, "completed")["output"]["approved"] is True

    # N-of-M: bob's approval leaves one to go and leaves bob's inbox; carol settles it.
    step_two = by_run[two]["step_id"]
    first = b.act(
        "/ui/approvals/decide", {"run_id": two, "step_id": step_two, "decision": "approve"}
    )
    assert "still needs more approvals" in b.flash_after(first)
    assert two not in {i["run_id"] for i in _inbox_api(c, bob)}
    left = {i["run_id"]: i for i in _inbox_api(c, carol)}[two]
    assert left["approvals_given"] == 1 and left["remaining"] == 1
    again = b.act(
        "/ui/approvals/decide", {"run_id": two, "step_id": step_two, "decision": "approve"}
    )
    assert b.flash_after(again).startswith("Refused: ")  # bob already decided
    cb = c.browser(carol)
    settled = cb.act(
        "/ui/approvals/decide", {"run_id": two, "step_id": step_two, "decision": "approve"}
    )
    assert "settled" in cb.flash_after(settled)
    assert c.wait_status(two, "completed")["output"]["by"] == ["bob", "carol"]

    # Reject: the run fails, its dead letter shows on the run page.
    anyone_step = {i["run_id"]: i for i in _inbox_api(c, bob)}[anyone]["step_id"]
    rejected = b.act(
        "/ui/approvals/decide",
        {"run_id": anyone, "step_id": anyone_step, "decision": "reject", "comment": "no"},
    )
    assert "Rejected" in b.flash_after(rejected)
    c.wait_status(anyone, "failed")
    run_page = b.get(f"/ui/runs/{anyone}")
    assert "Dead letters" in run_page.text and "pending" in run_page.text
    assert anyone not in b.get("/ui/approvals").text

    # A comment with a control character: refused at the confirmation (a page could
    # only carry it back escaped), nothing decided.
    legal_c = c.browser(carol)
    odd = legal_c.act(
        "/ui/approvals/decide",
        {"run_id": legal, "step_id": legal_step, "decision": "approve", "comment": "a\x01b"},
        confirm=False,
    )
    assert odd.status_code == 422 and "invisible characters" in alerts(odd.text)[0]
    # Sent straight to the action anyway (no confirmation): the API's refusal, shown.
    forced = legal_c.post(
        "/ui/approvals/decide",
        {
            "run_id": legal,
            "step_id": legal_step,
            "decision": "approve",
            "comment": "a\x01b",
            "csrf_token": legal_c.csrf(),
            "confirm": "yes",
        },
    )
    assert legal_c.flash_after(forced).startswith("Refused: ")
    assert c.wait_status(legal, "waiting_approval")
    bogus = legal_c.act(
        "/ui/approvals/decide", {"run_id": legal, "step_id": legal_step, "decision": "maybe"}
    )
    assert "Choose Approve or Reject" in legal_c.flash_after(bogus)
    assert not alerts(legal_c.get("/ui/approvals").text)  # the message was shown once
