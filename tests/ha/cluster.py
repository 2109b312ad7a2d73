"""A throwaway Patroni-managed PostgreSQL HA cluster: one etcd, two Patroni nodes.

Reusable by any test that needs a real failover: :class:`PatroniCluster` starts etcd
(Debian's ``/usr/bin/etcd``, v3.4, spoken to as ``etcd3:``) and N Patroni nodes
(``/usr/bin/patroni``, PostgreSQL 15 binaries) on free 127.0.0.1 ports, each with its own
data directory under one temporary root, ``synchronous_mode: true``, and waits (with a
deadline, never a sleep) for a leader plus a streaming synchronous standby.

PostgreSQL refuses to run as root, and Patroni runs ``initdb``/``postgres`` itself, so
when the test runs as root the Patroni processes run as the ``postgres`` user through
``runuser`` (as ``benchmarks/chaos.py`` does for its private cluster).

Teardown (:meth:`PatroniCluster.stop`, also on failure): SIGTERM every Patroni (it stops
its PostgreSQL), then SIGKILL whatever is left: each process group we started, and every
postmaster named by a node's ``postmaster.pid`` with all its children (Patroni starts the
postmaster in a session of its own, so it is not in Patroni's process group).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil  # type: ignore[import-untyped]

PG_BIN = Path(os.environ.get("TREADLE_PG_BIN", "/usr/lib/postgresql/15/bin"))
ETCD = Path("/usr/bin/etcd")
PATRONI = Path("/usr/bin/patroni")
PATRONICTL = Path("/usr/bin/patronictl")


def available() -> str | None:
    """Why the cluster cannot run here (a missing binary), or None when it can."""
    for binary in (ETCD, PATRONI, PATRONICTL, PG_BIN / "initdb"):
        if not binary.exists():
            return f"{binary} is missing (Debian: apt-get install patroni etcd-server etcd-client)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _poll(probe: Any, *, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Node:
    """One Patroni node: its name, ports, directory and process."""

    name: str
    pg_port: int
    rest_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        """PostgreSQL's data directory (Patroni initdbs or base-backups it)."""
        return self.dir / "data"

    @property
    def rest(self) -> str:
        """Base URL of the node's Patroni REST API."""
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def log(self) -> Path:
        """Patroni's (and its PostgreSQL's stderr) log file."""
        return self.dir / "patroni.log"

    def postmaster(self) -> psutil.Process | None:
        """The running postmaster named by ``postmaster.pid``, or None."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            proc = psutil.Process(pid)
        except (OSError, ValueError, psutil.Error):
            return None
        return proc if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE else None

    def url(self, database: str) -> str:
        """Asyncpg DSN of this node alone (any role)."""
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{database}"


class PatroniCluster:
    """etcd plus ``nodes`` Patroni nodes under ``root``; use as a context manager.

    Args:
        root: an empty directory, removed by :meth:`stop` unless ``keep``.
        nodes: Patroni nodes (2: a primary and its synchronous standby).
        keep: leave ``root`` (data and logs) in place after :meth:`stop`.
    """

    def __init__(self, root: Path, nodes: int = 2, *, keep: bool = False) -> None:
        self.root = root
        self.keep = keep
        self.scope = f"treadle-ha-{uuid.uuid4().hex[:8]}"
        self.etcd_port = _free_port()
        self.etcd_peer_port = _free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes = [
            Node(f"node{i}", _free_port(), _free_port(), root / f"node{i}") for i in range(nodes)
        ]
        # PostgreSQL refuses root: run Patroni (which runs initdb and postgres) as postgres.
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> PatroniCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 180) -> None:
        """Start etcd and every node; wait for a leader and a streaming sync standby.

        Raises:
            AssertionError: the deadline (seconds) passed; the logs' tails are in it.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self._start_etcd()
        for node in self.nodes:
            self._start_node(node)
        try:
            self.wait_healthy(timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_tails()}") from None

    def _start_etcd(self) -> None:
        data = self.root / "etcd"
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        with (self.root / "etcd.log").open("wb") as out:
            self.etcd = subprocess.Popen(
                [
                    str(ETCD), "--name", "etcd0", "--data-dir", str(data),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new",
                    "--initial-cluster-token", self.scope,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

        def healthy() -> bool:
            if self.etcd is not None and self.etcd.poll() is not None:
                raise AssertionError(f"etcd exited: {self._tail(self.root / 'etcd.log')}")
            try:
                return bool(httpx.get(client + "/health", timeout=2).json().get("health"))
            except (httpx.HTTPError, ValueError):
                return False

        _poll(healthy, timeout=60, what="etcd healthy")

    def _config(self, node: Node) -> dict[str, Any]:
        # Short DCS timings so a failover takes seconds, not Patroni's 30 s defaults
        # (Patroni requires loop_wait + 2 * retry_timeout <= ttl).
        # primary_start_timeout 0: a crashed primary fails over to the synchronous standby
        # at once instead of being restarted in place (Patroni's default waits 300 s).
        # fsync off: the tests kill processes, never the machine, so the page cache holds.
        return {
            "scope": self.scope,
            "namespace": "/treadle-test/",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{node.rest_port}",
                "connect_address": f"127.0.0.1:{node.rest_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": 10,
                    "loop_wait": 1,
                    "retry_timeout": 4,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "primary_start_timeout": 0,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_log_hints": "on",
                            "max_connections": 200,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "128MB",
                            "fsync": "off",
                            "full_page_writes": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data_dir),
                "bin_dir": str(PG_BIN),
                "pgpass": str(node.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "replicator"},
                },
                "parameters": {"unix_socket_directories": str(node.dir)},
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "tags": {"nofailover": False, "noloadbalance": False},
        }

    def _start_node(self, node: Node) -> None:
        node.dir.mkdir(parents=True)
        config = node.dir / "patroni.yml"
        # JSON is YAML: no YAML writer needed.
        config.write_text(json.dumps(self._config(node), indent=2))
        if self._as:
            for path in (self.root, node.dir, config):
                shutil.chown(path, "postgres")
        with node.log.open("wb") as out:
            node.proc = subprocess.Popen(
                [*self._as, str(PATRONI), str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        """Stop everything started (also after a failure); remove ``root`` unless kept."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGTERM)
        for node in self.nodes:
            if node.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=30)
        for node in self.nodes:
            self._kill_postmaster(node)
            if node.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=10)
        if self.etcd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.etcd.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.etcd.wait(timeout=10)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def _kill_postmaster(node: Node) -> None:
        postmaster = node.postmaster()
        if postmaster is None:
            return
        with contextlib.suppress(psutil.Error):
            procs = [postmaster, *postmaster.children(recursive=True)]
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(procs, timeout=10)

    # --- state ---------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """``GET /cluster`` from the first node that answers (``[]`` when none does)."""
        for node in self.nodes:
            try:
                r = httpx.get(node.rest + "/cluster", timeout=2)
                if r.status_code == 200:
                    return list(r.json().get("members", []))
            except (httpx.HTTPError, ValueError):
                continue
        return []

    def node(self, name: str) -> Node:
        """The node called ``name``."""
        return next(n for n in self.nodes if n.name == name)

    def leader(self) -> Node | None:
        """The node whose REST API answers ``/primary`` with 200 (a running primary)."""
        for node in self.nodes:
            try:
                if httpx.get(node.rest + "/primary", timeout=2).status_code == 200:
                    return node
            except httpx.HTTPError:
                continue
        return None

    def _sync_streaming(self, leader: Node) -> str | None:
        """The name of the standby streaming synchronously from ``leader``, or None."""

        async def query() -> Any:
            conn = await asyncpg.connect(leader.url("postgres"), timeout=5)
            try:
                # Free ports are picked before they are bound: on a shared machine another
                # process's PostgreSQL could take one first. Make sure it is ours.
                data_dir = await conn.fetchval("SHOW data_directory")
                if Path(data_dir).resolve() != leader.data_dir.resolve():
                    raise AssertionError(
                        f"port {leader.pg_port} is served by {data_dir}, not {leader.name}"
                    )
                return await conn.fetchval(
                    "SELECT application_name FROM pg_stat_replication "
                    "WHERE state = 'streaming' AND sync_state = 'sync' LIMIT 1"
                )
            finally:
                await conn.close()

        import asyncio

        try:
            value = asyncio.run(query())
        except (TimeoutError, OSError, asyncpg.PostgresError):
            return None
        return str(value) if value else None

    def healthy(self) -> tuple[Node, Node] | None:
        """(leader, streaming sync standby) when the cluster has both, else None.

        Patroni's view (``/cluster``: a leader and a ``sync_standby`` member) and
        PostgreSQL's (``pg_stat_replication``: that standby streaming, ``sync``) must agree.
        """
        members = self.members()
        leader = self.leader()
        if leader is None:
            return None
        roles = {m["name"]: m["role"] for m in members}
        if roles.get(leader.name) != "leader":
            return None
        standby = self._sync_streaming(leader)
        if standby is None or roles.get(standby) != "sync_standby":
            return None
        return leader, self.node(standby)

    def wait_healthy(self, timeout: float = 120) -> tuple[Node, Node]:
        """Poll :meth:`healthy` until it holds; return (leader, sync standby).

        Raises:
            AssertionError: ``timeout`` seconds passed, or a Patroni process exited.
        """

        def probe() -> tuple[Node, Node] | None:
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise AssertionError(f"patroni {node.name} exited: {self._tail(node.log)}")
            return self.healthy()

        result: tuple[Node, Node] = _poll(
            probe, timeout=timeout, what="a leader and a streaming sync standby", interval=0.2
        )
        return result

    # --- faults --------------------------------------------------------------------------

    def kill_primary_postmaster(self) -> Node:
        """``kill -9`` the current leader's postmaster (only the postmaster); return the node.

        Patroni notices on its next loop and, ``primary_start_timeout`` being 0, hands the
        leader key to the synchronous standby, which it promotes.
        """
        leader: Node = _poll(self.leader, timeout=30, what="a leader")
        postmaster = leader.postmaster()
        assert postmaster is not None, f"{leader.name} has no running postmaster"
        postmaster.send_signal(signal.SIGKILL)
        return leader

    def switchover(self, timeout: float = 60) -> tuple[Node, Node]:
        """Planned switchover to the sync standby (``patronictl switchover --force``).

        Returns:
            (old leader, new leader) once the new leader answers ``/primary``.
        """
        old, standby = self.wait_healthy(timeout=timeout)
        config = old.dir / "patroni.yml"
        done = subprocess.run(
            [
                *self._as, str(PATRONICTL), "-c", str(config), "switchover", self.scope,
                "--leader", old.name, "--candidate", standby.name, "--force",
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        new = _poll(
            lambda: (leader := self.leader()) is not None and leader is standby and leader,
            timeout=timeout,
            what=f"{standby.name} to lead",
        )
        return old, new

    def maintenance(self, on: bool, timeout: float = 60) -> None:
        """Patroni's maintenance mode on or off (``patronictl pause``/``resume --wait``).

        While on, Patroni neither fails over nor acts on PostgreSQL. A test that pauses
        WAL replay on a standby needs it: otherwise Patroni resumes the replay on its
        next loop (PostgreSQL 14+, ``Postgresql.handle_parameter_change``).
        """
        config = self.nodes[0].dir / "patroni.yml"
        done = subprocess.run(
            [*self._as, str(PATRONICTL), "-c", str(config), "pause" if on else "resume",
             self.scope, "--wait"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

    # --- clients -------------------------------------------------------------------------

    def hosts(self) -> str:
        """``host=h:p&host=h:p`` query of every node, in node order."""
        return "&".join(f"host=127.0.0.1:{n.pg_port}" for n in self.nodes)

    def url(self, database: str, driver: str = "postgresql+asyncpg") -> str:
        """Multi-host URL of ``database`` on whichever node is the read-write primary.

        ``driver`` ``postgresql+asyncpg`` gives a SQLAlchemy URL (``TREADLE_DATABASE_URL``);
        ``postgresql`` an asyncpg DSN (``host=a:1,b:2`` as asyncpg's DSN parser wants it).
        """
        if driver == "postgresql":
            hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
            return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"
        return f"{driver}://postgres@/{database}?{self.hosts()}&target_session_attrs=read-write"

    def create_database(self, name: str) -> str:
        """(Re)create database ``name`` on the primary, migrated to head; its multi-host URL.

        Returns once every node has it (a standby replays ``CREATE DATABASE`` after the
        primary's synchronous commit returns, which waits for flush only) and the
        migrations ran through the multi-host URL.
        """

        async def create() -> None:
            conn = await asyncpg.connect(self.url("postgres", "postgresql"))
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                await conn.execute(f'CREATE DATABASE "{name}"')
            finally:
                await conn.close()

        async def everywhere() -> bool:
            # asyncpg tries the hosts in order and gives up at the first that lacks the
            # database, before asking whether it is the read-write one: a standby that
            # has flushed but not yet replayed CREATE DATABASE would fail a multi-host
            # connect.
            for node in self.nodes:
                conn = await asyncpg.connect(node.url("postgres"), timeout=5)
                try:
                    if not await conn.fetchval(
                        "SELECT count(*) FROM pg_database WHERE datname = $1", name
                    ):
                        return False
                finally:
                    await conn.close()
            return True

        import asyncio

        from app.db.migrations import upgrade_to_head

        asyncio.run(create())
        _poll(lambda: asyncio.run(everywhere()), timeout=60, what=f"{name} on every node")
        url = self.url(name)
        upgrade_to_head(url)  # Alembic through the multi-host URL
        return url

    @staticmethod
    def _tail(path: Path, chars: int = 3000) -> str:
        try:
            return path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def log_tails(self) -> str:
        """The end of etcd's and each node's log, for failure messages."""
        parts = [f"--- etcd\n{self._tail(self.root / 'etcd.log', 1500)}"]
        parts += [f"--- {n.name}\n{self._tail(n.log)}" for n in self.nodes]
        return "\n".join(parts)
