"""``ctx.logger`` over real processes: a wait, a kill -9 mid-step, another worker finishes.

Each line is kept exactly once although the workflow body replays from the start on every
claim (docs/adr/0027-run-logs.md); the killed attempt's unsaved line is gone and the
next attempt keeps its own. Read back over HTTP, in the text report and with the CLI.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

from app.client import AsyncTreadleClient, TreadleClient
from tests.acceptance.conftest import Stack, cli, token
from tests.helpers import wait_for_sync

HANDLERS = "tests.acceptance.run_log_handlers"


def test_lines_survive_a_wait_and_a_crash_once_each(stack: Stack) -> None:
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"logs-{uuid.uuid4().hex[:8]}"
    doomed = stack.start_worker(HANDLERS)
    with stack.client() as c:
        resp = c.post("/runs", json={"workflow": "acc-logs", "input": {"name": name}})
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["run_id"]
        wait_for_sync(
            lambda: c.get(f"/runs/{run_id}").json()["status"] == "waiting_signal",
            what="run waits for go",
        )
        assert c.post(f"/runs/{run_id}/signals/go", json={"payload": 1}).status_code == 202
        wait_for_sync(
            lambda: list(shared.glob(f"{name}.started.1.{doomed.pid}")), what="held attempt 1"
        )
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        (shared / f"{name}.release").touch()
        stack.start_worker(HANDLERS)

        def finished() -> bool:
            return bool(c.get(f"/runs/{run_id}/result", params={"wait": 5}).json()["done"])

        wait_for_sync(finished, timeout=60, what="run finished")
        assert c.get(f"/runs/{run_id}").json()["status"] == "completed"
        items = c.get(f"/runs/{run_id}/logs").json()["items"]
        report = c.get(f"/runs/{run_id}/report.txt").text
    assert [(i["level"], i["message"], i["step_id"], i["attempt"]) for i in items] == [
        ("info", "start", None, None),
        ("info", "greeting", "greet", 1),
        ("debug", "waiting for go", None, None),
        ("warning", "resumed", None, None),
        # Attempt 1's line was never checkpointed (its worker died): only attempt 2's.
        ("info", "holding", "hold", 2),
        ("info", "done", None, None),
    ]
    assert items[3]["fields"] == {"go": 1}
    assert items[5]["fields"] == {"greeting": f"hello {name}", "held": "held by attempt 2"}
    section = report[report.index("== LOGS") : report.index("== DEAD LETTERS")]
    assert section.startswith("== LOGS (6 lines) ==")
    assert " [hold#2] holding" in section
    env = {**stack.env, "TREADLE_URL": stack.url, "TREADLE_TOKEN": token()}
    out = cli(env, "runs", "logs", run_id, "--level", "warning")
    assert out.splitlines()[0].endswith('warning  resumed {"go":1}')
    assert len(out.splitlines()) == 1
    # Another tenant's token: 404, as if the run did not exist.
    with stack.client(token(tenant="globex")) as other:
        assert other.get(f"/runs/{run_id}/logs").status_code == 404
    # The Python clients: the same lines, filters and pages, sync and async alike.
    with TreadleClient(stack.url, token()) as api:
        first = api.logs(run_id, limit=4)
        rest = api.logs(run_id, limit=4, page_token=first.next_page_token)
        assert [x.message for x in [*first.items, *rest.items]] == [i["message"] for i in items]
        assert rest.next_page_token is None
        held = api.logs(run_id, step="hold")
        assert [(x.step_id, x.attempt) for x in held.items] == [("hold", 2)]
        as_json = api.report(run_id)
        assert as_json.logs_total == 6 and [x.seq for x in as_json.logs] == [1, 2, 3, 4, 5, 6]

    async def via_async() -> list[str | None]:
        async with AsyncTreadleClient(stack.url, token()) as api:
            page = await api.logs(run_id, level="warning")
            return [x.message for x in page.items]

    assert asyncio.run(via_async()) == ["resumed"]
