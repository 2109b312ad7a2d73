"""A tab whose session ended says so (issue 34, item 12), over a real ``treadle serve``.

A session ends on the server (idle or absolute deadline, signed out elsewhere, its token
revoked) while the browser still holds its cookie. Every way back to the console then
lands on the sign-in page with "Your session ended": a page, a form, and a live-refresh
fragment, which answers 401 (``static/console.js`` opens the sign-in page from it) rather
than a redirect that ``fetch`` would follow silently. A browser that never had a session
is sent to sign in without the notice.
"""

from __future__ import annotations

from tests.console.conftest import ConsoleStack, end_every_session, statuses, tok


def test_a_page_a_form_and_a_fragment_of_an_ended_session_say_so(
    console: ConsoleStack, database_url: str
) -> None:
    b = console.browser(tok())
    assert b.get("/ui/runs").status_code == 200
    csrf = b.csrf()
    end_every_session(database_url)

    page = b.get("/ui/runs", params={"status": "queued"})
    assert page.status_code == 303
    assert page.headers["location"] == "/ui/login?expired=1&next=%2Fui%2Fruns%3Fstatus%3Dqueued"
    notice = b.get(page.headers["location"])
    assert "Your session ended" in " ".join(statuses(notice.text))

    b = console.browser(tok())
    csrf = b.csrf()
    end_every_session(database_url)
    form = b.post("/ui/logout", {"csrf_token": csrf})
    assert form.status_code == 303
    assert form.headers["location"].startswith("/ui/login?expired=1")

    b = console.browser(tok())
    end_every_session(database_url)
    fragment = b.get("/ui/runs/table", headers={"X-Console-Fragment": "1"})
    assert fragment.status_code == 401, fragment.text[:500]
    assert "location" not in fragment.headers
    # The stale cookie is cleared with it: the next page has no session to claim.
    assert b.get("/ui/runs").headers["location"] == "/ui/login?next=%2Fui%2Fruns"


def test_a_browser_that_never_signed_in_gets_no_notice(console: ConsoleStack) -> None:
    b = console.browser()
    page = b.get("/ui/runs")
    assert page.status_code == 303
    assert page.headers["location"] == "/ui/login?next=%2Fui%2Fruns"
    assert "Your session ended" not in " ".join(statuses(b.get(page.headers["location"]).text))
    fragment = b.get("/ui/runs/table", headers={"X-Console-Fragment": "1"})
    assert fragment.status_code == 401
