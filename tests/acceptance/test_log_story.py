"""The JSON log stream of ``treadle dev`` parses line by line and tells a run's story.

A real ``treadle dev`` process (API, in-process worker, migrations) with
``TREADLE_LOG_FORMAT=json`` and stderr captured on its own; a run with a retried step,
a signal wait and a finish is driven over HTTP, alongside a probe, a request with a
secret in its query string and a malformed request that uvicorn itself logs. Then every
line of stderr must be one JSON object, and the story lines, the access lines and the
stdlib loggers' lines must be there with their fields, and no token text anywhere.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core import json
from tests.acceptance.conftest import ROOT, free_port, token
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync, wait_until_serving

RUN_FIELDS = ("run_id", "workflow", "version", "tenant", "worker_id", "claim")


def _parse_every_line(text: str) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"stderr line {number} is not JSON: {line!r}")
        assert isinstance(record, dict), line
        for key in ("event", "level", "logger", "timestamp"):
            assert key in record, (key, line)
        records.append(record)
    return records


def _one(records: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def test_dev_json_log_stream_parses_line_by_line_and_tells_the_run_story(
    database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env.update(
        {
            "TREADLE_DATABASE_URL": database_url,
            "TREADLE_AUTH_MODE": "dev",
            "TREADLE_DEV_SECRET": DEV_SECRET,
            "TREADLE_DATA_DIR": str(tmp_path / "data"),
            "TREADLE_POLL_INTERVAL_SECONDS": "0.1",
            "TREADLE_LOG_FORMAT": "json",
            "PYTHONPATH": str(ROOT),
        }
    )
    out_path, err_path = tmp_path / "dev.out", tmp_path / "dev.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        dev = subprocess.Popen(
            [
                *(sys.executable, "-m", "app.cli.main", "dev", "--port", str(port)),
                *("--handlers", "tests.acceptance.log_handlers"),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=err,
        )
    secret = token(tenant="acme")
    try:
        wait_until_serving(url, dev, err_path, timeout=90)
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=60
        ) as client:
            started = client.post(
                "/runs",
                json={"workflow": "log-story", "input": {"name": "o-1"}},
                headers={"X-Request-ID": "story-submit-1"},
            )
            assert started.status_code == 201, started.text
            assert started.headers["x-request-id"] == "story-submit-1"
            run_id = started.json()["run_id"]

            def waiting() -> bool:
                return bool(client.get(f"/runs/{run_id}").json()["status"] == "waiting_signal")

            wait_for_sync(waiting, timeout=60, what="the signal wait")
            sent = client.post(f"/runs/{run_id}/signals/go", json={"payload": {"ok": True}})
            assert sent.status_code == 202, sent.text
            done = client.get(f"/runs/{run_id}/result", params={"wait": 30})
            assert done.status_code == 200, done.text
            assert done.json()["status"] == "completed"
            # A secret in a query string and a probe: neither may show in the access log.
            listed = client.get("/runs", params={"workflow": "log-story", "token": "hunter2"})
            assert listed.status_code in (200, 422), listed.text
            assert client.get("/healthz").status_code == 200
        # uvicorn's own logger: a request line h11 cannot parse.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(b"NOT HTTP AT ALL\x00\r\n\r\n")
            raw.recv(4096)
        wait_for_sync(
            lambda: b"Invalid HTTP request" in err_path.read_bytes(),
            timeout=30,
            what="uvicorn's warning",
        )
    finally:
        dev.send_signal(signal.SIGTERM)
        dev.wait(timeout=30)
    assert dev.returncode == 0, err_path.read_text()[-3000:]

    text = err_path.read_text()
    records = _parse_every_line(text)

    # The story, in order, every line with the run's fields.
    story = [
        r
        for r in records
        if r.get("run_id") == run_id and r["logger"] in ("treadle.run", "treadle.steps")
    ]
    for line in story:
        for key in RUN_FIELDS:
            assert key in line, (key, line)
        assert line["workflow"] == "log-story"
        assert line["level"] == "info"
    told = [
        (r["event"], r.get("step_id"), r.get("attempt"), r.get("outcome") or r.get("status"))
        for r in story
    ]
    assert told == [
        ("run claimed", None, None, "running"),
        ("step started", "charge", 1, None),
        ("step retry scheduled", "charge", 1, None),
        ("step finished", "charge", 1, "retry"),
        ("step started", "charge", 2, None),
        ("step finished", "charge", 2, "succeeded"),
        ("wait started", None, None, None),
        ("run released", None, None, "waiting_signal"),
        ("run claimed", None, None, "running"),
        ("step started", "ship", 1, None),
        ("step finished", "ship", 1, "succeeded"),
        ("run finished", None, None, "completed"),
    ], told
    assert [r["claim"] for r in story if r["event"] == "run claimed"] == [1, 2]
    retry = _one(story, event="step retry scheduled")
    assert retry["error_type"] == "RuntimeError"
    assert retry["next_attempt"] == 2
    assert retry["retry_in_seconds"] == pytest.approx(0.05)
    datetime.fromisoformat(retry["next_attempt_at"])
    # The message tried to forge a record: it stays a value of this one line.
    assert retry["message"].startswith("card declined\n{")
    assert not any(r["event"] == "forged" for r in records)
    for finished in (r for r in story if r["event"] == "step finished"):
        assert isinstance(finished["duration_ms"], float) and finished["duration_ms"] >= 0
    wait = _one(story, event="wait started")
    assert (wait["wait_kind"], wait["wait_name"]) == ("signal", "go")
    datetime.fromisoformat(wait["deadline"])
    released = _one(story, event="run released")
    assert (released["waiting_on"], released["wait_name"]) == ("signal", "go")
    assert _one(story, event="run finished")["reason"] == "succeeded"
    # A step's own stdlib logger carries the run's and the attempt's fields too.
    library = [r for r in records if r["logger"] == "log_handlers.library"]
    assert [(r["step_id"], r["attempt"], r["run_id"]) for r in library] == [
        ("charge", 1, run_id),
        ("charge", 2, run_id),
    ]

    # The access log: route templates, the request id, no tokens, queries or probes.
    access = [r for r in records if r["logger"] == "treadle.access"]
    submit = _one(access, request_id="story-submit-1")
    assert (submit["method"], submit["route"], submit["status"]) == ("POST", "/runs", 201)
    assert submit["client"] == "127.0.0.1"
    assert isinstance(submit["duration_ms"], float)
    signal_line = _one(access, route="/runs/{run_id}/signals/{name}")
    assert (signal_line["method"], signal_line["status"]) == ("POST", 202)
    assert len(signal_line["request_id"]) == 32  # minted: the client sent none
    assert {r["route"] for r in access} >= {"/runs/{run_id}", "/runs/{run_id}/result"}
    assert not [r for r in access if r["route"] in ("/healthz", "/readyz", "/metrics")]
    for line in access:
        assert run_id not in json.dumps(line)
        assert set(line) <= {
            *("event", "level", "logger", "timestamp", "request_id", "method", "route"),
            *("status", "duration_ms", "client"),
        }, line
    assert secret not in text
    assert secret.split(".")[0] not in text
    for leak in ("hunter2", "Bearer", "authorization"):
        assert leak.lower() not in text.lower(), leak

    # Stdlib loggers of the process itself, in the same stream.
    loggers = {r["logger"] for r in records}
    assert "alembic.runtime.migration" in loggers
    uvicorn_line = next(r for r in records if r["logger"] == "uvicorn.error")
    assert uvicorn_line["event"] == "Invalid HTTP request received."
    assert {"treadle.worker", "treadle.run", "treadle.steps"} <= loggers
