"""Schemathesis against the live API (real ``treadle serve`` + a real worker), from the spec.

Every operation of ``openapi/openapi.json`` is fuzzed with a valid dev token (all scopes,
the approver group), positive and negative data, the coverage, fuzzing and stateful
phases. Path parameters, workflow names and signal names are drawn partly from real
resources seeded first (completed, waiting, failed runs and their dead letters), so
requests get past the 404s into the handlers' real logic. Bounded for CI: a fixed number
of examples per operation, deterministic generation, one schemathesis worker.

Checks: no 5xx, every response matches its documented status, schema, content type and
headers. Run it by hand with more examples: ``TREADLE_FUZZ_EXAMPLES=200 uv run pytest
tests/acceptance/test_fuzz.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
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


def _seed(stack: Stack) -> dict[str, list[Any]]:
    """Create runs in several states; return the identifiers the fuzzer may reuse."""
    runs: list[str] = []
    with stack.client() as c:

        def submit(workflow: str, input: dict[str, Any]) -> str:
            r = c.post("/runs", json={"workflow": workflow, "input": input})
            assert r.status_code == 201, r.text
            run_id: str = r.json()["run_id"]
            runs.append(run_id)
            return run_id

        done = submit("acc-echo", {"value": {"a": [1, "two", None]}})
        waiting = submit("acc-approve", {"name": "fuzz"})
        failed = submit("acc-fail", {"name": "fuzz"})
        submit("acc-sleep", {"seconds": 3600})

        def status(run_id: str, wanted: str) -> bool:
            return bool(c.get(f"/runs/{run_id}").json()["status"] == wanted)

        wait_for_sync(lambda: status(done, "completed"), timeout=60, what="echo completed")
        wait_for_sync(lambda: status(waiting, "waiting_approval"), timeout=60, what="approval")
        wait_for_sync(lambda: status(failed, "failed"), timeout=60, what="failed run")
        dead = [d["dead_letter_id"] for d in c.get("/dead-letters").json()["items"]]
        assert dead, "the failed run left no dead letter"
        steps = [s["step_id"] for s in c.get(f"/runs/{waiting}/steps").json()["items"]]
    return {
        "runs": runs,
        "dead_letters": [str(d) for d in dead],
        "steps": [*steps, "manager"],
        "workflows": ["acc-echo", "acc-approve", "acc-fail", "acc-sleep", "acc-hold"],
        "signals": ["docs_uploaded"],
    }


def _config(path: Path, seeds: dict[str, list[Any]]) -> None:
    """A ``schemathesis.toml`` binding parameters to the seeded values part of the time."""
    lines = []
    bindings = {
        "path.run_id": "runs",
        "path.dead_letter_id": "dead_letters",
        "path.step_id": "steps",
        "path.name": "signals",
        "body.workflow": "workflows",
        "query.workflow": "workflows",
    }
    for name, values in seeds.items():
        lines.append(f"[dictionaries.{name}]\nvalues = {json.dumps(values)}\n")
    lines.append("[parameters]")
    for key, dictionary in bindings.items():
        lines.append(f'"{key}" = {{ dictionary = "{dictionary}", probability = 0.6 }}')
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.timeout(600)
def test_schemathesis_finds_no_failures(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()
    seeds = _seed(stack)
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
    api_log = stack.logs[0].read_text()
    assert result.returncode == 0, output[-20000:] + "\n--- API log tail ---\n" + api_log[-5000:]
    # Every operation of the committed spec was fuzzed (none filtered out or unloadable).
    spec = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    methods = {"get", "post", "put", "patch", "delete"}
    total = sum(1 for item in spec["paths"].values() for m in item if m in methods)
    assert f"{total} selected / {total} total" in output, output[-3000:]
    assert '"unhandled error"' not in api_log, api_log[-5000:]


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
