"""``GET /runs/{id}/events?follow=true`` over real HTTP with worker processes.

A client follows a run, drops its connection, the worker is killed with ``kill -9``
mid-step, a second worker takes over after the lease expires, and the client resumes
with ``Last-Event-ID``: in the end it has every event exactly once, in order, ending with
the terminal event, as ``GET /runs/{id}/events`` lists them. Also: bad input, the
per-tenant stream bound (429), heartbeats, and a SIGTERM that ends open streams at once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.client import AsyncTreadleClient, TreadleClient
from tests.acceptance.conftest import Stack, cli, cli_run, token
from tests.helpers import wait_for_sync

HANDLERS = "tests.acceptance.stream_handlers"


@pytest.fixture
def sstack(database_url: str, tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    """The stack with a stream bound of 2 per tenant and a 0.5 s heartbeat."""
    env = {
        **stack_env,
        "TREADLE_EVENT_STREAM_MAX_PER_TENANT": "2",
        "TREADLE_EVENT_STREAM_HEARTBEAT_SECONDS": "0.5",
    }
    s = Stack(database_url=database_url, tmp=tmp_path, env=env)
    try:
        s.start_api()
        yield s
    finally:
        s.stop()


def messages(resp: httpx.Response) -> Iterator[dict[str, str]]:
    """Parse an SSE body: one dict per message (``comment`` for a comment line)."""
    fields: dict[str, str] = {}
    for line in resp.iter_lines():
        if line == "":
            if fields:
                yield fields
            fields = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            fields[key] = f"{fields[key]}\n{value}" if key in fields else value


def _submit(stack: Stack, name: str, tok: str | None = None) -> str:
    with stack.client(tok) as c:
        resp = c.post("/runs", json={"workflow": "acc-stream", "input": {"name": name}})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["run_id"])


def _all_events(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 3}
    with stack.client() as c:
        while True:
            page = c.get(f"/runs/{run_id}/events", params=params).json()
            items += page["items"]
            if not page["next_page_token"]:
                return items
            params["page_token"] = page["next_page_token"]


def _started(shared: Path, name: str, pid: int) -> list[Path]:
    return list(shared.glob(f"{name}.started.*.{pid}"))


def test_follow_survives_a_dropped_connection_and_a_killed_worker(sstack: Stack) -> None:
    stack = sstack
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    name = f"sse-{uuid.uuid4().hex[:8]}"
    doomed = stack.start_worker(HANDLERS)
    run_id = _submit(stack, name)
    got: list[dict[str, str]] = []
    url = f"{stack.url}/runs/{run_id}/events"
    headers = {"Authorization": f"Bearer {token()}"}
    with (
        httpx.Client(timeout=30) as c,
        c.stream("GET", url, params={"follow": "true"}, headers=headers) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for msg in messages(resp):
            if "id" in msg:
                got.append(msg)
            # The model step's tokens of attempt 1 arrive while the step still runs.
            if sum(1 for m in got if m["event"] == "emitted" and '"token"' in m["data"]) == 5:
                break
    # The connection is dropped. The worker dies mid-step; a second one takes over.
    wait_for_sync(lambda: _started(shared, name, doomed.pid), what="model step on worker 1")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    stack.start_worker(HANDLERS)
    (shared / f"{name}.release").touch()
    end: dict[str, str] | None = None
    with (
        httpx.Client(timeout=60) as c,
        c.stream(
            "GET",
            url,
            params={"follow": "true"},
            headers={**headers, "Last-Event-ID": got[-1]["id"]},
        ) as resp,
    ):
        assert resp.status_code == 200
        for msg in messages(resp):
            if "id" in msg:
                got.append(msg)
            elif msg.get("event") == "end":
                end = msg
    assert end is not None, "the stream ended without its end message"
    listed = _all_events(stack, run_id)
    assert [int(m["id"]) for m in got] == [e["event_id"] for e in listed]  # once, in order
    assert [json.loads(m["data"]) for m in got] == listed
    assert [m["event"] for m in got] == [e["kind"] for e in listed]
    assert listed[-1]["kind"] == "run_completed"
    finish = json.loads(end["data"])
    assert finish["status"] == "completed" and finish["last_event_id"] == int(got[-1]["id"])
    assert finish["cause"] == "run_ended"
    # Each attempt's tokens, tagged with the step and the attempt.
    tokens = [
        (e["step_id"], e["data"]["attempt"], e["data"]["data"]["text"])
        for e in listed
        if e["kind"] == "emitted" and e["data"]["name"] == "token"
    ]
    words = [f"w{i}" for i in range(5)]
    assert tokens == [("model", 1, w) for w in words] + [("model", 2, w) for w in words]
    stages = [e["data"]["data"] for e in listed if e["kind"] == "emitted" and e["step_id"] is None]
    assert stages == ["thinking", {"done": len(" ".join(words))}]  # not repeated by replays


def _raw(stack: Stack, request: bytes) -> bytes:
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(65536)


def test_bad_input_is_a_clear_4xx_and_the_tenant_bound_is_429(sstack: Stack) -> None:
    stack = sstack
    stack.start_worker(HANDLERS)
    run_id = _submit(stack, f"bad-{uuid.uuid4().hex[:8]}")  # never released: never ends
    follow = {"follow": "true"}
    with stack.client() as c:
        assert c.get(f"/runs/{uuid.uuid4()}/events", params=follow).status_code == 404
        assert c.get("/runs/not-a-uuid/events", params=follow).status_code == 404
        # Arabic-Indic digits (str.isdigit() says yes), sent as UTF-8 bytes.
        arabic = "١٢".encode()
        for bad in (b"abc", b"-1", b"1.5", b"99999999999999999999", b"9223372036854775808", arabic):
            resp = c.get(f"/runs/{run_id}/events", params=follow, headers={b"Last-Event-ID": bad})
            assert resp.status_code == 400, (bad, resp.text)
            assert resp.headers["content-type"] == "application/problem+json"
            assert "Last-Event-ID" in resp.json()["detail"]
        for after in ("\x00", "abc", "-3", str(2**63)):
            resp = c.get(f"/runs/{run_id}/events", params={**follow, "after": after})
            assert resp.status_code == 422, (after, resp.text)
        # Stream-only parameters on a page are refused, not ignored.
        resp = c.get(f"/runs/{run_id}/events", params={"after": 3})
        assert resp.status_code == 400 and "follow=true" in resp.json()["detail"]
        # The page endpoint is unchanged.
        assert c.get(f"/runs/{run_id}/events").json()["items"][0]["kind"] == "run_submitted"
    other = token(tenant="other-tenant")
    with stack.client(other) as c:
        resp = c.get(f"/runs/{run_id}/events", params=follow)
        assert resp.status_code == 404, resp.text
    # A NUL in the header: the HTTP parser refuses the request before the app sees it.
    head = (
        f"GET /runs/{run_id}/events?follow=true HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token()}\r\nLast-Event-ID: 1\x002\r\n\r\n"
    ).encode()
    assert _raw(stack, head).startswith(b"HTTP/1.1 400")
    # Two streams per tenant (TREADLE_EVENT_STREAM_MAX_PER_TENANT=2); a third is 429.
    url = f"{stack.url}/runs/{run_id}/events"
    auth = {"Authorization": f"Bearer {token()}"}
    with (
        httpx.Client(timeout=30) as c,
        c.stream("GET", url, params=follow, headers=auth) as one,
        c.stream("GET", url, params=follow, headers=auth) as two,
    ):
        assert one.status_code == two.status_code == 200
        # Heartbeats while nothing happens (every 0.5 s here).
        # (The iterator stays referenced: closing it would close the stream.)
        reading, beats = messages(one), 0
        while beats < 2:
            beats += next(reading).get("comment") == "heartbeat"
        third = c.get(url, params=follow, headers=auth)
        assert third.status_code == 429, third.text
        assert third.headers["content-type"] == "application/problem+json"
        assert int(third.headers["retry-after"]) > 0
        # Another tenant has its own bound (and this run is not its own: 404, not 429).
        assert (
            c.get(
                f"{stack.url}/runs/{run_id}/events",
                params=follow,
                headers={"Authorization": f"Bearer {other}"},
            ).status_code
            == 404
        )

    # Closed streams give their slots back (the server noticed the disconnects).
    def reopened() -> bool:
        with httpx.Client(timeout=30) as c, c.stream("GET", url, params=follow, headers=auth) as r:
            return r.status_code == 200

    wait_for_sync(reopened, timeout=10, what="a stream slot given back")


def test_sigterm_ends_open_streams_at_once(sstack: Stack) -> None:
    stack = sstack
    stack.start_worker(HANDLERS)
    run_id = _submit(stack, f"term-{uuid.uuid4().hex[:8]}")  # never released: never ends
    assert stack.api is not None
    url = f"{stack.url}/runs/{run_id}/events"
    seen: list[dict[str, str]] = []
    with (
        httpx.Client(timeout=30) as c,
        c.stream(
            "GET", url, params={"follow": "true"}, headers={"Authorization": f"Bearer {token()}"}
        ) as resp,
    ):
        assert resp.status_code == 200
        started = 0.0
        for msg in messages(resp):
            seen.append(msg)
            if len(seen) == 2:  # the opening comment and the run_submitted event
                stack.api.send_signal(signal.SIGTERM)
                started = time.monotonic()
    # The stream ended with its shutdown comment, well within the 5 s graceful window.
    assert "resume with Last-Event-ID" in seen[-1].get("comment", ""), seen
    try:
        stack.api.wait(timeout=4.5)
    except subprocess.TimeoutExpired:
        pytest.fail("the API did not exit promptly with a stream open")
    assert time.monotonic() - started < 4.5
    log = stack.logs[0].read_text()
    assert "timeout graceful shutdown exceeded" not in log


def test_clients_and_the_cli_follow_a_run_to_its_end(sstack: Stack) -> None:
    stack = sstack
    shared = Path(stack.env["TREADLE_TEST_DIR"])
    stack.start_worker(HANDLERS)
    name = f"cli-{uuid.uuid4().hex[:8]}"
    run_id = _submit(stack, name)
    with TreadleClient(stack.url, token(), timeout=10) as client:
        seen = client.follow_events(run_id)
        first = next(seen)  # live: the run is still held in its model step
        assert first.kind == "run_submitted"
        (shared / f"{name}.release").touch()
        synced = [first, *seen]
    listed = _all_events(stack, run_id)
    assert [e.model_dump(mode="json") for e in synced] == listed
    assert synced[-1].kind == "run_completed"

    async def follow_async() -> list[dict[str, Any]]:
        async with AsyncTreadleClient(stack.url, token(), timeout=10) as client:
            after = listed[2]["event_id"]
            return [
                e.model_dump(mode="json") async for e in client.follow_events(run_id, after=after)
            ]

    assert asyncio.run(follow_async()) == listed[3:]
    env = {**stack.env, "TREADLE_URL": stack.url, "TREADLE_TOKEN": token()}
    out = cli(env, "runs", "events", run_id, "--follow").splitlines()
    assert [line.split()[0] for line in out] == [str(e["event_id"]) for e in listed]
    token_at = next(
        i for i, e in enumerate(listed) if e["step_id"] == "model" and e["kind"] == "emitted"
    )
    assert out[token_at].split()[2:4] == ["emitted", "[model]"]
    as_json = cli(env, "runs", "events", run_id, "-o", "json").splitlines()
    assert [json.loads(line) for line in as_json] == listed
    gone = cli_run(env, "runs", "events", str(uuid.uuid4()), "--follow")
    assert gone.returncode == 1 and "not found" in gone.stderr
