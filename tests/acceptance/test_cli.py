"""``treadle`` CLI conventions against a live server and real workers.

Exit codes (0 ok, 1 failed run or error answer, 2 usage, 3 unreachable), ``-o
json|table`` on read commands, ``runs execute`` / ``runs result`` on failing and
succeeding runs, paging flags, quoted ids, one-line errors (never a traceback), and the
ready lines of ``treadle serve`` and ``treadle worker``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from app.core.version import treadle_version
from tests.acceptance.conftest import Stack, cli_run, free_port, token
from tests.helpers import wait_for_sync

# Several server and worker processes (and CLI interpreters) start on a loaded machine.
pytestmark = pytest.mark.timeout(600)


def _env(stack: Stack) -> dict[str, str]:
    return {**stack.env, "TREADLE_URL": stack.url, "TREADLE_TOKEN": token()}


def _one_line_error(done: object) -> str:
    stderr = getattr(done, "stderr", "")
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_version_and_usage_errors(stack_env: dict[str, str]) -> None:
    done = cli_run(stack_env, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"treadle {treadle_version()}"
    assert cli_run(stack_env, "runs", "list", "--no-such-flag").returncode == 2
    bad_json = cli_run(stack_env, "runs", "start", "w", "--input", "{oops", "--token", "t")
    assert bad_json.returncode == 2 and "--input is not valid JSON" in bad_json.stderr
    bad_output = cli_run(stack_env, "runs", "get", "x", "-o", "yaml", "--token", "t")
    assert bad_output.returncode == 2


def test_execute_result_and_exit_codes(stack: Stack) -> None:
    stack.start_worker()
    env = _env(stack)

    ok = cli_run(env, "runs", "execute", "acc-echo", "--input", '{"value": {"n": 1}}', "-o", "json")
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert (result["status"], result["output"]) == ("completed", {"n": 1})
    assert f"run {result['run_id']} submitted" in ok.stderr

    bad = cli_run(env, "runs", "execute", "acc-fail", "--input", '{"name": "cli"}')
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "failure_non_retryable" in bad.stdout  # the table shows the result
    assert "ended failed (failure_non_retryable)" in bad.stderr
    failed_id = bad.stderr.split("run ", 1)[1].split()[0]

    assert cli_run(env, "runs", "result", result["run_id"], "--wait", "5").returncode == 0
    again = cli_run(env, "runs", "result", failed_id, "--wait", "5", "-o", "json")
    assert again.returncode == 1 and json.loads(again.stdout)["status"] == "failed"

    # A run that is still open after --wait: exit 1, saying so.
    start = cli_run(env, "runs", "start", "acc-approve", "--input", '{"name": "x"}', "-o", "json")
    open_id = json.loads(start.stdout)["run_id"]
    still = cli_run(env, "runs", "result", open_id, "--wait", "0")
    assert still.returncode == 1 and "is still" in still.stderr

    # Read commands: table by default (rich), JSON with -o json, same flag everywhere.
    table = cli_run(env, "runs", "get", failed_id)
    assert table.returncode == 0 and failed_id in table.stdout and "│" in table.stdout
    assert json.loads(cli_run(env, "runs", "get", failed_id, "-o", "json").stdout)["run_id"]
    text = cli_run(env, "runs", "report", failed_id)
    assert text.returncode == 0 and failed_id in text.stdout
    report = json.loads(cli_run(env, "runs", "report", failed_id, "-o", "json").stdout)
    assert report["run"]["status"] == "failed" and report["dead_letters"]
    letters = json.loads(cli_run(env, "dlq", "list", "-o", "json").stdout)["items"]
    letter = next(d for d in letters if d["run_id"] == failed_id)
    assert cli_run(env, "dlq", "list").stdout.count(failed_id) == 1
    requeued = cli_run(
        env, "dlq", "requeue", letter["dead_letter_id"], "--reason", "fixed", "-o", "json"
    )
    assert requeued.returncode == 0 and json.loads(requeued.stdout)["status"] == "requeued"
    twice = cli_run(env, "dlq", "requeue", letter["dead_letter_id"], "--reason", "again")
    assert twice.returncode == 1 and "409" in _one_line_error(twice)


def test_list_paging_flags(stack: Stack) -> None:
    stack.start_worker()  # registers acc-echo (submitting needs a registered workflow)
    env = _env(stack)
    ids = []
    for i in range(5):
        started = cli_run(
            env, "runs", "start", "acc-echo", "--input", f'{{"value": {i}}}', "-o", "json"
        )
        assert started.returncode == 0, started.stderr
        ids.append(json.loads(started.stdout)["run_id"])
    first = json.loads(cli_run(env, "runs", "list", "--limit", "2", "-o", "json").stdout)
    assert len(first["items"]) == 2 and first["next_page_token"]
    second = json.loads(
        cli_run(
            env,
            "runs",
            "list",
            "--limit",
            "2",
            "--page-token",
            first["next_page_token"],
            "-o",
            "json",
        ).stdout
    )
    assert not {r["run_id"] for r in first["items"]} & {r["run_id"] for r in second["items"]}
    everything = json.loads(
        cli_run(env, "runs", "list", "--all", "--limit", "1", "-o", "json").stdout
    )
    assert sorted(r["run_id"] for r in everything["items"]) == sorted(ids)
    assert everything["next_page_token"] is None
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    later = cli_run(env, "runs", "list", "--created-after", tomorrow, "-o", "json")
    assert json.loads(later.stdout)["items"] == []
    table = cli_run(env, "runs", "list", "--limit", "2")
    assert table.returncode == 0 and "--page-token" in table.stderr
    assert sum(run_id in table.stdout for run_id in ids) == 2


def test_submit_batch_from_json_lines_and_arrays(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()  # registers acc-echo
    env = _env(stack)
    lines = tmp_path / "runs.jsonl"
    lines.write_text(
        '{"workflow": "acc-echo", "input": {"value": 1}, "idempotency_key": "cli-b1"}\n'
        "\n"
        '{"workflow": "acc-echo", "input": {"value": 2}}\n'
    )
    ok = cli_run(env, "runs", "submit-batch", str(lines), "-o", "json")
    assert ok.returncode == 0, ok.stderr
    answer = json.loads(ok.stdout)
    assert [r["status"] for r in answer["results"]] == [201, 201]
    first = answer["results"][0]["run"]["run_id"]

    array = tmp_path / "runs.json"
    array.write_text(
        json.dumps(
            [
                {"workflow": "acc-echo", "input": {"value": 1}, "idempotency_key": "cli-b1"},
                {"workflow": "acc-nope"},
            ]
        )
    )
    partial = cli_run(env, "runs", "submit-batch", str(array))
    assert partial.returncode == 1, partial.stdout + partial.stderr  # one item failed
    assert first in partial.stdout and "workflow_not_found" in partial.stdout
    assert "0 created, 1 failed of 2" in partial.stderr

    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    usage = cli_run(env, "runs", "submit-batch", str(bad))
    assert usage.returncode == 2 and "neither a JSON array nor JSON lines" in usage.stderr


def test_error_answers_and_unreachable_servers_are_one_line(stack: Stack) -> None:
    env = _env(stack)
    # Quoted ids: "?" and "#" stay in the id, which reaches the run route (run_not_found).
    for hostile in ("x?wait=1", "y#z", "é ü"):
        done = cli_run(env, "runs", "get", hostile)
        assert done.returncode == 1
        assert "404 run_not_found" in _one_line_error(done), hostile
    sig = cli_run(env, "runs", "signal", "no?such", "go")
    assert sig.returncode == 1 and "run_not_found" in _one_line_error(sig)
    slashed = cli_run(env, "runs", "get", "../dead-letters")
    assert slashed.returncode == 1 and "404" in _one_line_error(slashed)
    unknown = cli_run(env, "runs", "start", "no-such-workflow")
    assert unknown.returncode == 1 and "workflow_not_found" in _one_line_error(unknown)
    refused = cli_run({**env, "TREADLE_TOKEN": "garbage"}, "runs", "list")
    assert refused.returncode == 1 and "401" in _one_line_error(refused)

    nowhere = {**env, "TREADLE_URL": f"http://127.0.0.1:{free_port()}"}
    for args in (
        ("runs", "list"),
        ("dlq", "list"),
        ("schedules", "list"),
        ("runs", "execute", "w"),
    ):
        down = cli_run(nowhere, *args)
        assert down.returncode == 3, (args, down.stderr)
        assert "cannot reach" in _one_line_error(down)


@pytest.fixture
def html_server() -> Iterator[str]:
    """A real local server answering every request with an HTML page (a proxy's)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body><h1>502 Bad Gateway</h1>\n<p>nginx</p></body></html>"
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_non_json_answers_are_one_line(stack_env: dict[str, str], html_server: str) -> None:
    env = {**stack_env, "TREADLE_URL": html_server, "TREADLE_TOKEN": token()}
    for args in (
        ("runs", "get", "x"),
        ("runs", "list"),
        ("schedules", "list"),
        ("runs", "report", "x"),
    ):
        done = cli_run(env, *args)
        assert done.returncode == 1, (args, done.stderr)
        line = _one_line_error(done)
        assert "502" in line and "unexpected_response" in line and "text/html" in line


def _ready_line(log: Path, prefix: str) -> str:
    def found() -> str | None:
        lines = [ln for ln in log.read_text().splitlines() if ln.startswith(prefix)]
        return lines[0] if lines else None

    return wait_for_sync(found, timeout=30, what=f"{prefix!r} in {log}")


def test_serve_and_worker_print_one_ready_line(stack: Stack, database_url: str) -> None:
    proc = stack.start_worker()
    worker_line = _ready_line(stack.logs[-1], "treadle worker: ready")
    assert f":{proc.pid}:" in worker_line and "acc-echo@1" in worker_line
    assert make_url(database_url).database in worker_line  # type: ignore[operator]
    api_line = _ready_line(stack.logs[0], "treadle serve: ready")
    assert f"ready on {stack.url} " in api_line


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_ready_lines_hide_the_database_password(
    database_url: str, tmp_path: Path, stack_env: dict[str, str]
) -> None:
    # The test server trusts local connections, so any password connects: it must not show.
    with_password = make_url(database_url).set(password="s3cret-pw").render_as_string(False)
    env = {**stack_env, "TREADLE_DATABASE_URL": with_password}
    stack = Stack(database_url=with_password, tmp=tmp_path, env=env)
    stack.start_api()
    try:
        stack.start_worker()
        for log, prefix in (
            (stack.logs[0], "treadle serve: ready"),
            (stack.logs[-1], "treadle worker: ready"),
        ):
            line = _ready_line(log, prefix)
            assert "s3cret-pw" not in log.read_text() and "***" in line
    finally:
        stack.stop()
