"""Every console list page answers a bad ``page_token`` the same way.

The first page, 200, with an alert saying the link was stale (app/console/web.py
``first_page_if_stale``).
"""

from __future__ import annotations

from app.console.web import STALE_PAGE_TOKEN
from tests.console.conftest import ConsoleStack, alerts, tok

LIST_PAGES = ("/ui/runs", "/ui/approvals", "/ui/schedules", "/ui/dead-letters")
BAD_TOKENS = ("garbage", "eyJub3QiOiJvdXJzIn0", "x" * 999)


def test_every_list_page_shows_the_first_page_under_an_alert_for_a_bad_token(
    console: ConsoleStack,
) -> None:
    c = console
    alice = tok(subject="alice", groups=("finance",))
    bob = tok(subject="bob", groups=("finance",))
    run_id = c.submit("con-approve", {"group": "finance", "note": "pay"}, alice)
    c.wait_status(run_id, "waiting_approval")
    with c.api(alice) as api:
        # The API itself refuses these tokens: the console's answer is its own choice.
        for path in ("/runs", "/approvals", "/schedules", "/dead-letters"):
            assert api.get(path, params={"page_token": "garbage"}).status_code == 400, path
    b = c.browser(bob)
    for path in LIST_PAGES:
        good = b.get(path)
        assert good.status_code == 200, (path, good.text[:2000])
        assert STALE_PAGE_TOKEN not in " ".join(alerts(good.text))
        for bad in BAD_TOKENS:
            page = b.get(path, params={"page_token": bad})
            assert page.status_code == 200, (path, bad, page.text[:2000])
            assert STALE_PAGE_TOKEN in alerts(page.text), (path, alerts(page.text))
            # the first page, with no link carrying the bad token on
            assert f"page_token={bad}" not in page.text, path
            if path in ("/ui/runs", "/ui/approvals"):
                assert run_id in page.text, path
