"""Real processes: ``treadle serve`` under uvicorn and ``treadle worker`` subprocesses.

Tests talk to the API over real HTTP (httpx) and kill workers with real signals.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from app.auth.dev import DevTokens
from app.auth.principal import ALL_SCOPES
from tests.conftest import DEV_SECRET, pooler_settings
from tests.helpers import TLS, wait_for_sync, wait_until_serving

ROOT = Path(__file__).resolve().parents[2]
# What ``treadle worker`` prints on stdout once registered (app.cli.ready.worker_line).
WORKER_READY = b"treadle worker: ready as "


def cli_run(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``treadle <args>`` in a subprocess with ``env``; return it whatever its exit code."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli(env: dict[str, str], *args: str) -> str:
    """Run ``treadle <args>`` in a subprocess with ``env``; assert exit 0; return stdout."""
    done = cli_run(env, *args)
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def token(tenant: str = "acme", subject: str = "alice", scopes: object = ALL_SCOPES) -> str:
    """A dev token signed with the test secret."""
    return DevTokens(DEV_SECRET).mint(tenant_id=tenant, subject=subject, scopes=scopes)  # type: ignore[arg-type]


@dataclass
class Stack:
    """An API process plus worker processes on one database."""

    database_url: str
    tmp: Path
    env: dict[str, str]
    url: str = ""
    api: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    #: Checks the API's certificate when ``env`` has TREADLE_SSL_CERTFILE (https).
    verify: ssl.SSLContext = TLS

    def _spawn(
        self, args: list[str], name: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "app.cli.main", *args],
                cwd=ROOT,
                env={**self.env, **(extra_env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def start_api(self, extra_env: dict[str, str] | None = None) -> None:
        port = free_port()
        scheme = "https" if "TREADLE_SSL_CERTFILE" in {**self.env, **(extra_env or {})} else "http"
        self.url = f"{scheme}://127.0.0.1:{port}"
        self.api = self._spawn(["serve", "--port", str(port)], "api", extra_env)
        # Generous: on a loaded 2-core box the interpreter alone takes ~25 s to start.
        wait_until_serving(self.url, self.api, self.logs[-1], timeout=90, verify=self.verify)

    def start_worker(
        self,
        handlers: str | Sequence[str] = "tests.acceptance.handlers",
        concurrency: int = 8,
        extra_env: dict[str, str] | None = None,
        timeout: float = 90,
    ) -> subprocess.Popen[bytes]:
        """Start a worker subprocess for one or more handler modules; wait until registered.

        ``timeout`` bounds each of the two waits (the ready line, then the registration
        seen over HTTP), in seconds.
        """
        modules = [handlers] if isinstance(handlers, str) else list(handlers)
        proc = self._spawn(
            [
                "worker",
                *(arg for module in modules for arg in ("--handlers", module)),
                "--concurrency",
                str(concurrency),
            ],
            "worker",
            extra_env,
        )
        self.workers.append(proc)
        log = self.logs[-1]

        def announced() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited: {log.read_text()[-3000:]}")
            return WORKER_READY in log.read_bytes()

        def registered(c: httpx.Client) -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited: {log.read_text()[-3000:]}")
            items = c.get("/workflows").json()["items"]
            live = {w for wf in items for v in wf["versions"] for w in v["live_workers"]}
            return any(f":{proc.pid}:" in w for w in live)

        # The worker prints its ready line once its registration is committed
        # (app/cli/ready.py): wait for that in its log, which costs the API nothing, then
        # see the registration over HTTP as before. Polling GET /workflows through the
        # worker's whole start-up took CPU from the start-up on a 2-core machine.
        wait_for_sync(announced, timeout=timeout, what=f"worker {proc.pid} ready line")
        with self.client() as c:
            wait_for_sync(
                lambda: registered(c), timeout=timeout, what=f"worker {proc.pid} registered"
            )
        return proc

    def client(self, tok: str | None = None) -> httpx.Client:
        """A client of the API with ``Bearer tok`` (default: an all-scopes acme token)."""
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {tok or token()}"},
            timeout=60,
            verify=self.verify,  # plain HTTP unless https; see tests.helpers.TLS
        )

    def stop(self) -> None:
        procs = [*self.workers, *([self.api] if self.api else [])]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def stack_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    """Environment for the stack's processes (short leases for fast recovery)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env.update(
        {
            "TREADLE_DATABASE_URL": database_url,
            # Explicit: `treadle serve` on PostgreSQL refuses dev auth nobody chose.
            "TREADLE_AUTH_MODE": "dev",
            "TREADLE_DEV_SECRET": DEV_SECRET,
            "TREADLE_DATA_DIR": str(tmp_path / "data"),
            "TREADLE_LEASE_TTL_SECONDS": "3",
            "TREADLE_HEARTBEAT_INTERVAL_SECONDS": "0.5",
            "TREADLE_POLL_INTERVAL_SECONDS": "0.1",
            "TREADLE_DRAIN_GRACE_SECONDS": "5",
            "TREADLE_LOG_FORMAT": "json",
            "TREADLE_TEST_DIR": str(tmp_path / "shared"),
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update({f"TREADLE_{k.upper()}": str(v) for k, v in pooler_settings(database_url).items()})
    (tmp_path / "shared").mkdir()
    return env


@pytest.fixture
def stack(database_url: str, tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    """A running API (no workers yet) on this test's database."""
    s = Stack(database_url=database_url, tmp=tmp_path, env=stack_env)
    try:
        s.start_api()  # inside the try: an API that never got ready is stopped too
        yield s
    finally:
        s.stop()
