"""The console's journeys (issue 17), in headless Chromium against real ``treadle`` processes.

1. Start the onboarding example from its form, approve it as a sales manager in a second
   browser, send the documents signal, and watch the Run page complete by itself.
2. A rejected approval ends its run ``failed`` with a dead letter on the Run page; requeue
   it from the Dead letters page and see the run live again.
3. A second tenant's session sees none of the first tenant's runs.
4. Approving a run one submitted is refused with the API's message.

Databases: every journey runs on SQLite and PostgreSQL (the ``database_url`` fixture's two
parameters). Wall times measured on the shared 2-core box (stack start-up included, which
dominates), SQLite / PostgreSQL: onboarding 28 / 30 s, rejection and requeue 25 / 27 s,
another tenant 13 / 11 s, self-approval 18 / 19 s; so both stay, and the whole
``tests/browser`` run on SQLite takes about 2 min 15 s serially.

Waiting is always Playwright's ``expect`` with a deadline (it polls the page), never a
sleep; "by itself" is checked with a marker set in the page's JavaScript that a reload
would erase.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect

from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from tests.acceptance.conftest import Stack, token
from tests.browser.conftest import Browser
from tests.conftest import DEV_SECRET

#: The onboarding example's approval group (``examples/onboarding.py``: ``group=``).
SALES_MANAGERS = "sales-manager"
#: Milliseconds a run gets to move (a worker poll, a step, a retry after 0.5 s) on a box
#: shared with other tests.
MOVE_MS = 90_000


def approver_token(tenant: str = "acme", subject: str = "maria") -> str:
    """A dev token whose ``groups`` claim holds the onboarding approvers' group.

    ``tests.acceptance.conftest.token`` mints no groups; dev tokens carry them in the
    ``groups`` claim (``app/auth/dev.py``, :meth:`DevTokens.mint`).
    """
    return DevTokens(DEV_SECRET).mint(
        tenant_id=tenant, subject=subject, scopes=ALL_SCOPES, groups=[SALES_MANAGERS]
    )


def fact(page: Page, name: str) -> Locator:
    """The value (``<dd>``) of the Run page's fact ``name`` (``<dt>``), e.g. "Status"."""
    return page.locator(
        f"#run-live dl.facts >> xpath=dt[normalize-space()='{name}']/following-sibling::dd[1]"
    )


def mark_page(page: Page) -> None:
    """Set a JavaScript marker that survives live refreshes and dies with a reload."""
    page.evaluate("window.journeyMarker = 'not reloaded'")


def assert_not_reloaded(page: Page) -> None:
    """The page changed by its live refresh, not because it was loaded again."""
    assert page.evaluate("window.journeyMarker") == "not reloaded"


def confirm(b: Browser, button: str, shot: str) -> None:
    """On a confirmation page: screenshot it, press ``button``, wait for the next page."""
    expect(b.page.locator("h1")).to_have_count(1)
    b.screenshot(shot)
    with b.page.expect_navigation(wait_until="networkidle"):
        b.page.get_by_role("button", name=button).click()


def start_onboarding(b: Browser, customer: str, email: str) -> str:
    """From the Workflows page, fill onboarding's generated form and start it; its run id."""
    b.goto("/ui/workflows", "workflows")
    with b.page.expect_navigation(wait_until="networkidle"):
        b.page.get_by_role("link", name="Start a run of onboarding").click()
    b.screenshot("start-onboarding")
    b.page.get_by_label("Customer Id").fill(customer)
    b.page.get_by_label("Company").fill(f"{customer} Ltd")
    b.page.get_by_label("Email").fill(email)
    with b.page.expect_navigation(wait_until="networkidle"):
        b.page.get_by_role("button", name="Start run").click()
    expect(b.page.get_by_role("status")).to_contain_text("started")
    assert "/ui/runs/" in b.page.url, b.page.url
    return b.page.url.rsplit("/", 1)[-1]


def decide(b: Browser, run_id: str, button: str, comment: str) -> None:
    """In the Approvals inbox, decide the approval of ``run_id`` with ``comment``, confirmed."""
    b.goto("/ui/approvals", "approvals")
    card = b.page.locator("section.card").filter(has=b.page.get_by_role("link", name=run_id))
    expect(card).to_have_count(1)
    card.get_by_label("Comment (optional)").fill(comment)
    with b.page.expect_navigation(wait_until="networkidle"):
        card.get_by_role("button", name=button).click()
    confirm(b, button, f"confirm-{button.lower()}")


@pytest.fixture
def timed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print the journey's wall time (``-s`` shows it; the report quotes these)."""
    began = time.monotonic()
    yield
    print(f"\n[journey wall time] {request.node.name}: {time.monotonic() - began:.1f} s")


def test_onboarding_start_approve_signal_complete(
    timed: None, console_with_examples: Stack, browser: Browser, second_browser: Browser
) -> None:
    submitter, approver = browser, second_browser
    submitter.sign_in(token(subject="alice"), name="runs-empty")
    run_id = start_onboarding(submitter, "cust-journey-1", "ops@acme.test")
    page = submitter.page
    mark_page(page)
    expect(fact(page, "Status")).to_have_text("waiting_approval", timeout=MOVE_MS)
    expect(fact(page, "Waiting on")).to_contain_text("approval manager")
    submitter.screenshot("run-waiting-approval")

    approver.sign_in(approver_token(), name="approver-runs")
    decide(approver, run_id, "Approve", "looks good")
    expect(approver.page.get_by_role("status")).to_contain_text("Approved 'manager'")
    approver.screenshot("approved")

    # The submitter's Run page moves on by itself: now it waits for the documents.
    expect(fact(page, "Status")).to_have_text("waiting_signal", timeout=MOVE_MS)
    expect(fact(page, "Waiting on")).to_contain_text("signal docs_uploaded")
    assert_not_reloaded(page)
    submitter.screenshot("run-waiting-signal")

    page.get_by_label("Signal name").fill("docs_uploaded")
    page.get_by_label("Payload (JSON)").fill('{"files": ["id.pdf"], "tax_id": "DE123"}')
    with page.expect_navigation(wait_until="networkidle"):
        page.get_by_role("button", name="Send signal").click()
    confirm(submitter, "Send signal", "confirm-signal")
    expect(page.get_by_role("status")).to_contain_text("Signal 'docs_uploaded' sent")
    mark_page(page)
    expect(fact(page, "Status")).to_have_text("completed", timeout=MOVE_MS)
    assert_not_reloaded(page)
    page.locator("#d-output summary").click()
    expect(page.locator("#d-output pre")).to_contain_text("bill_acct_")
    expect(page.locator("#d-output pre")).to_contain_text("maria")
    submitter.screenshot("run-completed")

    # The remaining pages, for their screenshots: the run is listed, no schedule exists.
    submitter.goto("/ui/runs", "runs")
    expect(page.get_by_role("link", name=run_id)).to_have_count(1)
    submitter.goto("/ui/schedules", "schedules")
    expect(page.locator("h1")).to_have_text("Schedules")


def test_rejected_run_fails_with_a_dead_letter_then_requeue(
    timed: None, console: Stack, browser: Browser, second_browser: Browser
) -> None:
    # examples.expenses: an approval without on_reject, so a rejection fails the run
    # (onboarding's on_reject handler turns its rejection into a completed run instead).
    worker = console.start_worker("examples.expenses")
    submitter, approver = browser, second_browser
    submitter.sign_in(token(subject="alice"))
    submitter.goto("/ui/workflows/expense-report/start", "start-expense-report")
    submitter.page.get_by_label("Employee").fill("ana")
    submitter.page.get_by_label("Amount Cents").fill("4200")
    with submitter.page.expect_navigation(wait_until="networkidle"):
        submitter.page.get_by_role("button", name="Start run").click()
    run_id = submitter.page.url.rsplit("/", 1)[-1]
    page = submitter.page
    expect(fact(page, "Status")).to_have_text("waiting_approval", timeout=MOVE_MS)
    mark_page(page)

    approver.sign_in(approver_token(subject="maria"))
    decide(approver, run_id, "Reject", "no receipt")
    expect(approver.page.get_by_role("status")).to_contain_text("Rejected 'manager'")

    expect(fact(page, "Status")).to_have_text("failed", timeout=MOVE_MS)
    assert_not_reloaded(page)
    dead = page.locator("#run-live h2:text-is('Dead letters') + ul li")
    expect(dead).to_have_count(1)
    expect(dead).to_contain_text("pending")
    expect(page.locator("#d-error pre")).to_contain_text("no receipt")
    submitter.screenshot("run-failed-dead-letter")

    # Without a worker the requeued run stays where requeue puts it (queued), so the
    # browser can see that live state before a worker replays the rejection again.
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)

    submitter.goto("/ui/dead-letters", "dead-letters")
    row = page.locator("tr").filter(has=page.get_by_role("link", name=run_id))
    expect(row).to_have_count(1)
    row.get_by_label("Reason").fill("receipt found")
    with page.expect_navigation(wait_until="networkidle"):
        row.get_by_role("button", name="Requeue").click()
    confirm(submitter, "Requeue", "confirm-requeue")
    expect(page.get_by_role("status")).to_contain_text(f"run {run_id} runs again")
    submitter.screenshot("requeued")

    submitter.goto(f"/ui/runs/{run_id}", "run-requeued")
    expect(fact(page, "Status")).to_have_text("queued")
    expect(page.locator("#run-live h2:text-is('Dead letters') + ul li")).to_contain_text("requeued")
    expect(page.locator("#run-live table").last).to_contain_text("dead_letter_requeued")


def test_another_tenant_sees_none_of_the_runs(
    timed: None, console_with_examples: Stack, browser: Browser
) -> None:
    with console_with_examples.client(token(tenant="acme")) as acme:
        created = acme.post(
            "/runs",
            json={
                "workflow": "onboarding",
                "input": {"customer_id": "c-1", "company": "Acme", "email": "a@acme.test"},
            },
        )
        assert created.status_code in (200, 201, 202), created.text
        run_id = created.json()["run_id"]
        assert acme.get("/runs").json()["items"], "acme sees its run through the API"
    globex = token(tenant="globex", subject="gina")
    # The API's own words for another tenant's run id.
    missing = httpx.get(
        f"{console_with_examples.url}/runs/{run_id}",
        headers={"Authorization": f"Bearer {globex}"},
        timeout=60,
    )
    assert missing.status_code == 404
    detail = missing.json()["detail"]

    browser.sign_in(globex, name="globex-runs")
    page = browser.page
    expect(page.locator("h1")).to_have_text("Runs")
    expect(page.get_by_role("link", name=run_id)).to_have_count(0)
    expect(page.locator("main")).not_to_contain_text(run_id)

    response = page.goto(f"{console_with_examples.url}/ui/runs/{run_id}")
    assert response is not None and response.status == 404
    expect(page.get_by_role("alert")).to_contain_text(detail)
    browser.screenshot("globex-run-404")

    # The search box finds nothing either.
    browser.goto("/ui/runs", "globex-runs-again")
    page.get_by_label("Run id or idempotency key").fill(run_id)
    with page.expect_navigation(wait_until="networkidle"):
        page.get_by_role("button", name="Filter").click()
    browser.screenshot("globex-search")
    expect(page.get_by_role("link", name=run_id)).to_have_count(0)


def test_own_run_approval_says_why_instead_of_buttons(
    timed: None, console_with_examples: Stack, browser: Browser
) -> None:
    # A sales manager starts the run and then tries to approve it.
    maria = approver_token(subject="maria")
    browser.sign_in(maria)
    run_id = start_onboarding(browser, "cust-self", "maria@acme.test")
    expect(fact(browser.page, "Status")).to_have_text("waiting_approval", timeout=MOVE_MS)

    # Listed, with why she cannot decide it instead of buttons the API would refuse.
    browser.goto("/ui/approvals", "approvals-own-run")
    card = browser.page.locator("section.card").filter(
        has=browser.page.get_by_role("link", name=run_id)
    )
    expect(card).to_have_count(1)
    expect(card).to_contain_text("does not allow self-approval")
    expect(card.get_by_role("button")).to_have_count(0)

    # The API refuses her decision (what the note says), and nothing moved.
    with console_with_examples.client(maria) as c:
        refused = c.post(f"/runs/{run_id}/approvals/manager", json={"decision": "approve"})
        assert refused.status_code == 403, refused.text
        assert "submitted this run" in refused.json()["detail"], refused.text
        assert c.get(f"/runs/{run_id}").json()["status"] == "waiting_approval"
