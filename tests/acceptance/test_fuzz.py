"""Schemathesis against the live API (real ``treadle serve`` + a real worker), from the spec.

Every operation of ``openapi/openapi.json`` is fuzzed with a valid dev token (all scopes,
the approver group), positive and negative data, the examples, coverage, fuzzing and
stateful phases. Requests get past the 404s into the handlers' real logic three ways:

- path parameters, workflow names, signal names, crons and time zones are drawn partly
  from real resources seeded first (runs in every state, dead letters, approvals,
  schedules), each run-consuming operation from its own pool (``POOLS``);
- the stateful phase follows the spec's OpenAPI links (``app/api/links.py``: ``POST
  /runs`` -> ``/runs/{run_id}/…``, ``POST /schedules`` -> ``/schedules/{schedule_id}/…``)
  and the links schemathesis infers, with ids taken from real responses;
- ``fuzz_hooks.map_body`` lets a share of generated submissions through input validation.

Bounded for CI: a fixed number of examples per operation, deterministic generation, one
schemathesis worker (about a minute per database on a quiet machine).

Checks: no 5xx, every response matches its documented status, schema, content type and
headers; and depth: every operation answered 2xx at least once (counted from the API's
``treadle_http_requests_total``; the table is printed, ``pytest -s`` shows it). Run it by
hand with more examples: ``TREADLE_FUZZ_EXAMPLES=200 uv run pytest
tests/acceptance/test_fuzz.py``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from tests.acceptance import fuzz_hooks
from tests.acceptance.conftest import ROOT, Stack
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    ]
)
EXAMPLES = int(os.environ.get("TREADLE_FUZZ_EXAMPLES", "25"))
STATEFUL_EXAMPLES = 4 * EXAMPLES


def _seed(stack: Stack) -> dict[str, list[Any]]:
    """Create resources in many states; return the identifiers the fuzzer may reuse.

    A successful call often uses its resource up (a run cancelled or migrated, an approval
    decided, a dead letter requeued), so each such operation gets its own pool (see
    :data:`POOLS`) and one operation cannot exhaust another's. Reads draw from all runs.
    """
    pools: dict[str, list[str]] = {name: [] for name in POOLS.values()}
    with stack.client() as c:
        wanted: dict[str, str] = {}

        def submit(
            pool: str, workflow: str, input: Any, state: str, version: str | None = None
        ) -> None:
            body = {"workflow": workflow, "input": input, "version": version}
            r = c.post("/runs", json=body)
            assert r.status_code == 201, r.text
            run_id: str = r.json()["run_id"]
            pools.setdefault(pool, []).append(run_id)
            wanted[run_id] = state

        submit("runs", "acc-echo", {"value": {"a": [1, "two", None]}}, "completed")
        for i in range(3):
            name = {"name": f"fuzz-{i}"}
            submit("approvable", "acc-approve", name, "waiting_approval")
            submit("migratable", "acc-migrate", name, "waiting_approval", version="1")
            submit("retryable", "acc-fail", name, "failed")
            submit("requeueable", "acc-fail", name, "failed")
            submit("cancellable", "acc-sleep", {"seconds": 3600}, "waiting_timer")
            submit("resumable", "acc-sleep", {"seconds": 3600}, "waiting_timer")
            submit("rerunnable", "acc-echo", {"value": i}, "completed")
            submit("signallable", "acc-sleep", {"seconds": 3600}, "waiting_timer")
            submit("pausable", "acc-sleep", {"seconds": 3600}, "waiting_timer")
            submit("unpausable", "acc-sleep", {"seconds": 3600}, "waiting_timer")

        def settled() -> bool:
            return all(
                c.get(f"/runs/{run_id}").json()["status"] == state
                for run_id, state in wanted.items()
            )

        wait_for_sync(settled, timeout=60, what="seeded runs in their states")
        for run_id in pools["unpausable"]:
            paused = c.post(f"/runs/{run_id}/pause", json={"reason": "fuzz"})
            assert paused.status_code == 200, paused.text
        letters = c.get("/dead-letters").json()["items"]
        steps = {
            s["step_id"]
            for run_id in pools["approvable"]
            for s in c.get(f"/runs/{run_id}/steps").json()["items"]
        }
        # A rerun starts from a journaled step of a finished run (docs/adr/0022-…).
        from_steps = {
            s["step_id"]
            for run_id in pools["rerunnable"]
            for s in c.get(f"/runs/{run_id}/steps").json()["items"]
        }
        # Batches that change nothing (those runs are not paused: skipped), to read and cancel.
        batches = []
        for _ in range(3):
            r = c.post("/runs:unpause", json={"run_ids": pools["signallable"]})
            assert r.status_code == 202, r.text
            batches.append(r.json()["batch_id"])
        schedules = []
        for title, timing in (
            ("fuzz-cron", {"cron": "0 3 * * *"}),
            ("fuzz-once", {"at": "2099-01-01T00:00:00Z"}),
        ):
            r = c.post(
                "/schedules", json={"name": title, "workflow": "acc-echo", "input": {}, **timing}
            )
            assert r.status_code == 201, r.text
            schedules.append(r.json()["schedule_id"])
        # Endpoints to read and list deliveries of, and others to delete (a delete uses
        # one up). 127.0.0.1 is allowed in this stack (stack_env below); nothing listens
        # on port 9, so the worker's deliveries fail and are retried, as a down target's.
        for pool in ("webhooks", "deletable_webhooks"):
            for i in range(3):
                r = c.post("/webhooks", json={"url": f"http://127.0.0.1:9/fuzz-{i}"})
                assert r.status_code == 201, r.text
                pools.setdefault(pool, []).append(r.json()["webhook_id"])
    return {
        **pools,
        "runs": list(wanted),
        "dead_letters": [
            d["dead_letter_id"] for d in letters if d["run_id"] in pools["requeueable"]
        ],
        "steps": sorted(steps),
        "from_steps": sorted(from_steps),
        "batches": batches,
        "schedules": schedules,
        "workflows": ["acc-echo", "acc-approve", "acc-fail", "acc-sleep", "acc-hold"],
        "signals": ["docs_uploaded"],
        "crons": sorted(fuzz_hooks.VALID_CRONS),
        "timezones": ["UTC", "Europe/Berlin", "America/New_York"],
        "versions": ["2"],
    }


# Parameters bound to seeded values 60 % of the time (the rest stays generated).
BINDINGS = {
    "path.run_id": "runs",
    "path.dead_letter_id": "dead_letters",
    "path.step_id": "steps",
    "path.name": "signals",
    "path.schedule_id": "schedules",
    "path.batch_id": "batches",
    "path.webhook_id": "webhooks",
    "body.workflow": "workflows",
    "query.workflow": "workflows",
    "body.cron": "crons",
    "body.timezone": "timezones",
}
# Operations that use a run up draw run ids from their own pool of runs in the right state.
POOLS = {
    "cancel_run": "cancellable",
    "decide_approval": "approvable",
    "migrate_run": "migratable",
    "retry_run": "retryable",
    "resume_run": "resumable",
    "requeue_dead_letter": "requeueable",
    "rerun_run": "rerunnable",
    # Live runs nothing else ends, so a signal finds one to accept it whatever else ran.
    "send_signal": "signallable",
    "pause_run": "pausable",
    "unpause_run": "unpausable",
    "cancel_batch": "cancelled_batches",
    "delete_webhook": "deletable_webhooks",
}


def _config(path: Path, seeds: dict[str, list[Any]]) -> None:
    """A ``schemathesis.toml`` binding parameters to the seeded values part of the time."""

    def bind(dictionary: str) -> str:
        return f'{{ dictionary = "{dictionary}", probability = 0.6 }}'

    lines = [f"[dictionaries.{name}]\nvalues = {json.dumps(v)}\n" for name, v in seeds.items()]
    lines.append("[parameters]")
    lines += [f'"{key}" = {bind(dictionary)}' for key, dictionary in BINDINGS.items()]
    # The stateful phase chains calls along the spec's links (POST /runs -> /runs/{run_id}/…,
    # POST /schedules -> /schedules/{schedule_id}/…): give it more scenarios than the rest.
    lines.append(f"\n[phases.stateful]\ngeneration.max-examples = {STATEFUL_EXAMPLES}")
    for operation, pool in POOLS.items():
        overrides = {"path.run_id": pool}
        if operation == "migrate_run":
            # Only a migration takes the newer version (elsewhere "2" is unknown: 404).
            overrides["body.version"] = "versions"
        if operation == "rerun_run":
            overrides["body.from_step"] = "from_steps"
        if operation == "requeue_dead_letter":
            overrides = {"path.dead_letter_id": "dead_letters"}
        if operation == "cancel_batch":
            overrides = {"path.batch_id": "cancelled_batches"}
        if operation == "delete_webhook":
            overrides = {"path.webhook_id": "deletable_webhooks"}
        params = ", ".join(f'"{k}" = {bind(v)}' for k, v in overrides.items())
        lines.append(
            f'\n[[operations]]\ninclude-operation-id = "{operation}"\nparameters = {{ {params} }}'
        )
    path.write_text("\n".join(lines) + "\n")


def _coverage(metrics_text: str, spec: dict[str, Any]) -> dict[str, Counter[str]]:
    """Responses per operation (``METHOD /path``) and status, from the API's own metrics."""
    found: dict[str, Counter[str]] = {
        f"{m.upper()} {path}": Counter() for path, item in spec["paths"].items() for m in item
    }
    pattern = re.compile(
        r'^treadle_http_requests_total\{method="(\w+)",route="([^"]+)",status="(\d+)"\} (\S+)$'
    )
    for line in metrics_text.splitlines():
        match = pattern.match(line)
        if match and f"{match[1]} {match[2]}" in found:
            found[f"{match[1]} {match[2]}"][match[3]] += int(float(match[4]))
    return found


def _table(coverage: dict[str, Counter[str]]) -> str:
    rows = [f"{'operation':48} {'calls':>6} {'2xx':>5} {'404':>5} {'4xx':>5} {'5xx':>4}"]
    for op, counts in coverage.items():
        by = {k: sum(v for s, v in counts.items() if s[0] == k) for k in "245"}
        four = by["4"] - counts["404"]
        rows.append(
            f"{op:48} {sum(counts.values()):6} {by['2']:5} {counts['404']:5} {four:5} {by['5']:4}"
        )
    return "\n".join(rows)


@pytest.fixture
def stack_env(stack_env: dict[str, str]) -> dict[str, str]:
    """The shared stack's environment, with webhook targets on 127.0.0.1 allowed.

    The fuzzer's webhook bodies are pointed at 127.0.0.1 (tests/acceptance/fuzz_hooks.py)
    so that ``POST /webhooks`` reaches its real logic; the guard itself is tested in
    tests/unit/test_webhook_signing.py and tests/integration/test_webhooks.py.
    """
    return {**stack_env, "TREADLE_WEBHOOK_ALLOW_PRIVATE": "true"}


@pytest.mark.timeout(600)
def test_schemathesis_finds_no_failures(stack: Stack, tmp_path: Path) -> None:
    # Cancelled before any worker can finish them: cancelling one again answers 200.
    with stack.client() as c:
        cancelled = []
        for _ in range(3):
            r = c.post("/runs:unpause", json={"run_ids": [str(uuid.uuid4())]})
            assert r.status_code == 202, r.text
            stopped = c.post(f"/batches/{r.json()['batch_id']}/cancel")
            assert stopped.status_code == 200 and stopped.json()["state"] == "cancelled"
            cancelled.append(r.json()["batch_id"])
    stack.start_worker()
    seeds = {**_seed(stack), "cancelled_batches": cancelled}
    config = tmp_path / "schemathesis.toml"
    _config(config, seeds)
    tok = DevTokens(DEV_SECRET).mint(
        tenant_id="acme",
        subject=f"fuzz-{uuid.uuid4().hex[:6]}",
        scopes=ALL_SCOPES,
        groups=["sales-manager"],
    )
    cli = Path(sys.executable).parent / "schemathesis"
    result = subprocess.run(
        [
            str(cli),
            "--config-file",
            str(config),
            "run",
            str(ROOT / "openapi" / "openapi.json"),
            "--url",
            stack.url,
            "--header",
            f"Authorization: Bearer {tok}",
            "--checks",
            CHECKS,
            "--max-examples",
            str(EXAMPLES),
            "--generation-deterministic",
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--no-color",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path / "report"),
        ],
        cwd=tmp_path,
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.acceptance.fuzz_hooks",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    output = result.stdout + result.stderr
    (tmp_path / "schemathesis.txt").write_text(output)
    api_log = stack.logs[0].read_text()
    assert result.returncode == 0, output[-20000:] + "\n--- API log tail ---\n" + api_log[-5000:]
    # Every operation of the committed spec was fuzzed (none filtered out or unloadable).
    spec = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    methods = {"get", "post", "put", "patch", "delete"}
    total = sum(1 for item in spec["paths"].values() for m in item if m in methods)
    assert f"{total} selected / {total} total" in output, output[-3000:]
    assert '"unhandled error"' not in api_log, api_log[-5000:]
    # Depth: every operation got past validation and lookups into its real logic at least
    # once (a 2xx), from the seeded ids and the ids that responses and links handed on.
    coverage = _coverage(httpx.get(stack.url + "/metrics").text, spec)
    table = _table(coverage)
    (tmp_path / "coverage.txt").write_text(table + "\n")
    print(f"\nschemathesis responses per operation ({stack.database_url.split(':')[0]}):")
    print(table)
    shallow = [op for op, counts in coverage.items() if not any(s[0] == "2" for s in counts)]
    assert not shallow, f"operations never answered 2xx: {shallow}\n{table}"
    # The stateful phase followed links (the spec's and those schemathesis inferred).
    links = re.search(r"API Links:\s+(\d+) covered", output)
    assert links is not None and int(links[1]) > 0, output[-3000:]


def _raw_get(url: str, extra_header: bytes) -> bytes:
    """Send one GET /healthz with ``extra_header`` over a raw socket; return the reply."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + extra_header
            + b"\r\n\r\n"
        )
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return reply


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_oversized_headers_are_refused_before_the_app(stack: Stack) -> None:
    """Headers over TREADLE_MAX_HEADER_BYTES (64 KiB) are refused.

    Just over the limit: 431 problem+json from the app's first middleware. Megabytes:
    the HTTP server stops reading and answers 400 with the connection closed, so a client
    cannot make it buffer them. Headers well under the limit are served.
    """
    assert _raw_get(stack.url, b"X-Small: " + b"a" * 8000).startswith(b"HTTP/1.1 200")
    reply = _raw_get(stack.url, b"X-Big: " + b"a" * 70_000)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]
    assert b"application/problem+json" in reply, reply[:400]
    try:
        reply = _raw_get(stack.url, b"X-Huge: " + b"a" * 5_000_000)
    except ConnectionResetError:
        pass  # closed while we were still sending: refused all the same
    else:
        assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
        assert b"connection: close" in reply.lower(), reply[:300]
    # The server still serves normal requests afterwards.
    assert _raw_get(stack.url, b"X-Ok: 1").startswith(b"HTTP/1.1 200")
