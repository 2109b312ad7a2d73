"""HTTP: ``POST /runs`` requests/s and p99 of ``treadle serve`` beside a bare FastAPI INSERT.

Usage::

    uv run python -m benchmarks.http_api --seconds 10 --connections 16

Both servers run as one uvicorn process on 127.0.0.1 against their own fresh database on
the same PostgreSQL; the load generator is closed-loop and bounded (``--connections``
requests in flight): ``wrk`` when on PATH (``make bench`` never installs it), otherwise
an httpx async client in this process. Treadle's side submits a registered one-step
workflow with a dev-mode bearer token (auth, JSON Schema validation, idempotency check,
run + event rows, NOTIFY); the bare side inserts one row (:mod:`benchmarks.bare_api`).
Non-2xx answers are counted and reported; a run with any is flagged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from app.auth.dev import DevTokens
from app.db.migrations import upgrade_to_head
from benchmarks.common import (
    DEV_SECRET,
    RESULTS,
    ROOT,
    asyncpg_url,
    fresh_database,
    percentile,
    stop,
    worker_env,
)
from benchmarks.latency import _Client

BODY = {"workflow": "bench-steps", "input": {"steps": 1}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.get(base + "/docs", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError("server did not start")


_WRK_LUA = """
wrk.method = "POST"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
{auth}
"""


def _unit_ms(value: str) -> float:
    match = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", value)
    if match is None:
        raise ValueError(f"unexpected wrk latency {value!r}")
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[match.group(2)]
    return float(match.group(1)) * scale


def _wrk(url: str, token: str | None, seconds: float, connections: int) -> dict[str, Any]:
    auth = f'wrk.headers["Authorization"] = "Bearer {token}"' if token else ""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(_WRK_LUA.format(body=json.dumps(BODY), auth=auth))
        script = f.name
    try:
        out = subprocess.run(
            [
                "wrk",
                "-t2",
                f"-c{connections}",
                f"-d{max(int(seconds), 1)}s",
                "--latency",
                "-s",
                script,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        Path(script).unlink()
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.MULTILINE)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE)
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if rps is None or p50 is None or p99 is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return {
        "generator": "wrk",
        "requests_per_second": round(float(rps.group(1)), 1),
        "p50_ms": round(_unit_ms(p50.group(1)), 2),
        "p99_ms": round(_unit_ms(p99.group(1)), 2),
        "non_2xx": int(bad.group(1)) if bad else 0,
    }


async def _httpx(url: str, token: str | None, seconds: float, connections: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    latencies: list[float] = []
    bad = 0
    limits = httpx.Limits(max_connections=connections)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as client:
        end = time.monotonic() + seconds

        async def loop() -> None:
            nonlocal bad
            while time.monotonic() < end:
                t0 = time.perf_counter()
                resp = await client.post(url, json=BODY)
                latencies.append((time.perf_counter() - t0) * 1000)
                if resp.status_code >= 300:
                    bad += 1

        started = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(connections)))
        elapsed = time.monotonic() - started
    return {
        "generator": "httpx",
        "requests_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.5), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "non_2xx": bad,
    }


def load(url: str, token: str | None, seconds: float, connections: int) -> dict[str, Any]:
    """Closed-loop ``POST`` load on ``url`` for ``seconds``: wrk if installed, else httpx.

    Returns requests/s, p50 and p99 latency (ms), the generator used and non-2xx count.
    """
    if shutil.which("wrk"):
        return _wrk(url, token, seconds, connections)
    return asyncio.run(_httpx(url, token, seconds, connections))


def _serve(cmd: list[str], env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc)
    except BaseException:
        stop([proc])
        raise
    return proc


@contextlib.contextmanager
def serving_treadle() -> Iterator[tuple[int, str, int]]:
    """``treadle serve`` on a fresh database with the workflow registered.

    Yields ``(port, bearer token with runs:write, server pid)``; stops the server after.
    """
    with fresh_database("http") as url:
        upgrade_to_head(asyncpg_url(url))

        async def register() -> None:
            client = _Client(url)
            try:
                await client.register()
            finally:
                await client.close()

        asyncio.run(register())
        port = _free_port()
        proc = _serve(
            [sys.executable, "-m", "app.cli.main", "serve", "--port", str(port)],
            worker_env(url),
            port,
        )
        try:
            token = DevTokens(DEV_SECRET).mint(
                tenant_id="bench", subject="bench", scopes=["runs:write"]
            )
            yield port, token, proc.pid
        finally:
            stop([proc])


def measure_treadle(seconds: float, connections: int) -> dict[str, Any]:
    """``POST /runs`` on ``treadle serve`` (a fresh database, the workflow registered)."""
    with serving_treadle() as (port, token, _pid):
        return load(f"http://127.0.0.1:{port}/runs", token, seconds, connections)


def measure_bare(seconds: float, connections: int) -> dict[str, Any]:
    """``POST /runs`` on the bare FastAPI + one INSERT endpoint."""
    with fresh_database("bare") as url:
        port = _free_port()
        cmd = [sys.executable, "-m", "uvicorn", "benchmarks.bare_api:app"]
        cmd += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
        proc = _serve(cmd, worker_env(url, BARE_DATABASE_URL=url), port)
        try:
            return load(f"http://127.0.0.1:{port}/runs", None, seconds, connections)
        finally:
            stop([proc])


def measure(seconds: float, connections: int) -> dict[str, Any]:
    """Both sides and the ratio Treadle/bare of requests/s."""
    treadle = measure_treadle(seconds, connections)
    bare = measure_bare(seconds, connections)
    return {
        "connections": connections,
        "seconds": seconds,
        "treadle": treadle,
        "bare": bare,
        "ratio": round(treadle["requests_per_second"] / bare["requests_per_second"], 3),
    }


def main() -> None:
    """Parse arguments, measure, print and save."""
    parser = argparse.ArgumentParser(description="POST /runs vs a bare FastAPI INSERT")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    result = measure(args.seconds, args.connections)
    print(json.dumps(result, indent=2))
    (RESULTS / "http.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
