"""Signing in with an API key; a revoked key ends the session; a redacted run stays redacted."""

from __future__ import annotations

import re

import httpx

from tests.acceptance.conftest import cli
from tests.console.conftest import ConsoleStack, statuses, tok
from tests.helpers import wait_for_sync


def test_api_key_session_revocation_and_redacted_run(console: ConsoleStack) -> None:
    c = console
    env = c.stack.env
    created = cli(
        env,
        "api-keys",
        "create",
        "--tenant",
        "acme",
        "--name",
        "console",
        "--scopes",
        "runs:write,runs:read",
    )
    key = created.strip().splitlines()[-1]
    key_id = re.search(r"key_id\s+(\S+)", created)
    assert key.startswith("trd_") and key_id is not None

    # Sign in with the key (pasted with a "Bearer " prefix and blanks, as copied).
    b = c.browser()
    assert b.sign_in(f"  Bearer {key}\n").status_code == 303
    page = b.get("/ui/runs")
    assert page.status_code == 200 and "api-key:" in page.text  # the key's subject

    run_id = c.submit("con-signal", {"text": "classified input"}, key)
    c.wait_status(run_id, "waiting_signal")
    assert "classified input" in b.get(f"/ui/runs/{run_id}").text

    # The key is revoked: the run fails its authorization re-check at its next attempt
    # and is redacted; the session's next page finds its token refused and ends.
    cli(env, "api-keys", "revoke", key_id.group(1), "--tenant", "acme")
    with c.api() as api:
        assert api.post(f"/runs/{run_id}/signals/go", json={"payload": 1}).status_code == 202
    run = c.wait_status(run_id, "failed")
    assert run["reason"] == "failure_authorization" and run["redacted"] is True

    # The CLI is another process: the API refuses the key within its verified-token
    # cache window, TREADLE_AUTH_CACHE_TTL_SECONDS (docs/security.md#token-cache).
    def refused() -> httpx.Response | None:
        page = b.get(f"/ui/runs/{run_id}")
        return page if page.status_code != 200 else None

    ended = wait_for_sync(
        refused,
        timeout=60,
        interval=0.2,
        what="the session's key refused",
    )
    assert ended.status_code == 303
    assert ended.headers["location"].startswith("/ui/login?expired=1")
    notice = b.get(ended.headers["location"])
    assert "Your session ended" in " ".join(statuses(notice.text))
    assert b.get("/ui/runs").status_code == 303  # the session is gone for good

    # Another user of the tenant sees the run as redacted: no payloads anywhere.
    reader = c.browser(tok(subject="carol"))
    shown = reader.get(f"/ui/runs/{run_id}")
    assert shown.status_code == 200
    assert "This run is redacted" in shown.text and "classified input" not in shown.text
    assert "failure_authorization" in shown.text
