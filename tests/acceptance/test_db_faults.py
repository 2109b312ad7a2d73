"""PostgreSQL faults against a real ``treadle serve`` (and worker): 503s, never 500s or hangs.

PostgreSQL only (each test says so in its parametrization): the faults are PostgreSQL's
own. A second connection takes ``LOCK TABLE runs IN ACCESS EXCLUSIVE MODE`` or row locks;
the tests learn that a request is blocked from ``pg_stat_activity`` (``wait_event_type =
'Lock'``), never by sleeping. Requests are real concurrent httpx requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.engine import make_url

from app.core.settings import Settings
from app.db.database import Database
from app.engine.registry import Registry
from tests.acceptance.conftest import WORKER_READY, Stack, token
from tests.conftest import DEV_SECRET
from tests.helpers import Deadlock, TcpForwarder, wait_for, wait_for_sync

PG_ONLY = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
AUTH = {"Authorization": f"Bearer {token()}"}


def dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(False)


@pytest.fixture
def start_api(
    database_url: str, tmp_path: Path, stack_env: dict[str, str]
) -> Iterator[Callable[[dict[str, str]], Stack]]:
    """Start ``treadle serve`` processes with extra ``TREADLE_*`` settings; stop them after."""
    started: list[Stack] = []

    def start(extra_env: dict[str, str]) -> Stack:
        stack = Stack(database_url=database_url, tmp=tmp_path, env=stack_env)
        started.append(stack)
        stack.start_api(extra_env)
        return stack

    yield start
    for stack in started:
        stack.stop()


async def register_handlers(database_url: str, tmp_path: Path) -> None:
    """Register the acceptance workflows, as a worker would, without running one."""
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET, data_dir=tmp_path))
    try:
        async with db.write() as conn:
            await Registry.from_modules(["tests.acceptance.handlers"]).register(conn)
    finally:
        await db.dispose()


@contextlib.asynccontextmanager
async def runs_table_locked(database_url: str) -> AsyncIterator[None]:
    """Hold ``ACCESS EXCLUSIVE`` on ``runs`` from a separate connection until exit."""
    conn = await asyncpg.connect(dsn(database_url))
    tx = conn.transaction()
    await tx.start()
    await conn.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
    try:
        yield
    finally:
        await tx.rollback()
        await conn.close()


async def lock_waiters(observer: Any) -> int:
    """Sessions of this database (other than the observer) blocked on a lock right now."""
    return int(
        await observer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
    )


async def blocked(observer: Any, n: int) -> None:
    async def enough() -> bool:
        return await lock_waiters(observer) >= n

    await wait_for(enough, timeout=30, what=f"{n} sessions blocked on the lock")


def submission(key: str) -> dict[str, Any]:
    return {"workflow": "acc-echo", "input": {"value": key}, "idempotency_key": key}


def assert_503(response: httpx.Response, code: str) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "2"
    body = response.json()
    assert (body["status"], body["code"]) == (503, code), body


async def timed(call: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await call
    return response, time.monotonic() - started


# --- pool exhaustion --------------------------------------------------------------------


@PG_ONLY
async def test_requests_beyond_the_pool_queue_for_a_connection(
    database_url: str, tmp_path: Path, start_api: Callable[[dict[str, str]], Stack]
) -> None:
    """Requests beyond the pool wait for a connection, then all succeed.

    Pool of 2, both connections held by requests blocked on a lock: further requests wait
    for a connection (within TREADLE_DB_POOL_TIMEOUT_SECONDS) and then all succeed.
    """
    await register_handlers(database_url, tmp_path)
    api = start_api({"TREADLE_DB_POOL_SIZE": "2", "TREADLE_DB_POOL_TIMEOUT_SECONDS": "60"})
    observer = await asyncpg.connect(dsn(database_url))
    sent: set[str] = set()

    def trace(key: str) -> Any:
        async def hook(event: str, _info: dict[str, Any]) -> None:
            if event == "http11.send_request_body.complete":
                sent.add(key)

        return hook

    try:
        async with httpx.AsyncClient(base_url=api.url, headers=AUTH, timeout=90) as client:
            async with runs_table_locked(database_url):
                holders = [asyncio.create_task(client.get("/runs")) for _ in range(2)]
                await blocked(observer, 2)  # both pooled connections wait on the lock
                keys = [f"queued-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
                queued = [
                    asyncio.create_task(
                        client.post("/runs", json=submission(k), extensions={"trace": trace(k)})
                    )
                    for k in keys
                ]

                async def all_sent() -> bool:
                    return sent == set(keys)

                await wait_for(all_sent, timeout=30, what="queued requests sent")
                assert not any(t.done() for t in [*holders, *queued])
            responses = await asyncio.gather(*holders, *queued)
        assert [r.status_code for r in responses] == [200, 200, 201, 201, 201, 201]
        stored = await observer.fetchval(
            "SELECT count(*) FROM runs WHERE idempotency_key = ANY($1::text[])", keys
        )
        assert stored == 4
    finally:
        await observer.close()


@PG_ONLY
async def test_pool_exhaustion_answers_503_in_bounded_time_and_loses_nothing(
    database_url: str, tmp_path: Path, start_api: Callable[[dict[str, str]], Stack]
) -> None:
    """No connection within the pool timeout: 503 database_busy, in bounded time.

    With Retry-After, never 500, never a hang; once the lock is released the blocked
    requests finish, the refused ones succeed when retried, and each run exists once.
    """
    await register_handlers(database_url, tmp_path)
    pool_timeout = 1.5
    api = start_api(
        {"TREADLE_DB_POOL_SIZE": "2", "TREADLE_DB_POOL_TIMEOUT_SECONDS": str(pool_timeout)}
    )
    observer = await asyncpg.connect(dsn(database_url))
    keys = [f"busy-{i}-{uuid.uuid4().hex[:6]}" for i in range(5)]
    try:
        async with httpx.AsyncClient(base_url=api.url, headers=AUTH, timeout=90) as client:
            async with runs_table_locked(database_url):
                holders = [asyncio.create_task(client.get("/runs")) for _ in range(2)]
                await blocked(observer, 2)
                extra = await asyncio.gather(
                    *(timed(client.post("/runs", json=submission(k))) for k in keys),
                    timed(client.get("/runs")),
                    timed(client.get(f"/runs/{uuid.uuid4()}")),
                )
                for response, elapsed in extra:
                    assert_503(response, "database_busy")
                    # Queued for the pool timeout, then refused: bounded, not a hang.
                    assert pool_timeout * 0.9 <= elapsed < pool_timeout + 10, elapsed
                assert not any(t.done() for t in holders)
            assert [r.status_code for r in await asyncio.gather(*holders)] == [200, 200]
            # Nothing of the refused submissions was stored: each retry creates its run.
            retried = [await client.post("/runs", json=submission(k)) for k in keys]
        assert [r.status_code for r in retried] == [201] * 5
        rows = await observer.fetch(
            "SELECT idempotency_key, run_id FROM runs WHERE idempotency_key = ANY($1::text[])",
            keys,
        )
        assert {r["idempotency_key"]: str(r["run_id"]) for r in rows} == {
            k: r.json()["run_id"] for k, r in zip(keys, retried, strict=True)
        }
        log = api.logs[-1].read_text()
        assert '"unhandled error"' not in log, log[-3000:]
    finally:
        await observer.close()


# --- statement timeout --------------------------------------------------------------------


@PG_ONLY
async def test_statement_timeout_is_503_and_the_worker_survives(
    database_url: str, tmp_path: Path, start_api: Callable[[dict[str, str]], Stack]
) -> None:
    """A statement cancelled by statement_timeout: 503 in the API, a retry in the worker.

    With ``runs`` locked, GET and POST /runs answer 503 database_timeout within the
    statement timeout; a worker whose checkpoint is cancelled gives the run back and
    finishes it once the lock is gone; the refused submission stored nothing.
    """
    timeout = {"TREADLE_DB_STATEMENT_TIMEOUT_SECONDS": "1"}
    api = start_api(timeout)
    worker = api.start_worker(extra_env=timeout)
    worker_log = api.logs[-1]
    shared = Path(api.env["TREADLE_TEST_DIR"])
    key = f"late-{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(base_url=api.url, headers=AUTH, timeout=60) as client:
        held = await client.post("/runs", json={"workflow": "acc-hold", "input": {"name": "stmt"}})
        assert held.status_code == 201, held.text
        held_id = held.json()["run_id"]
        wait_for_sync(
            lambda: any(shared.glob("stmt.started.*")), timeout=30, what="held step started"
        )
        async with runs_table_locked(database_url):
            (listed, t_list), (submitted, t_submit) = await asyncio.gather(
                timed(client.get("/runs")), timed(client.post("/runs", json=submission(key)))
            )
            for response, elapsed in ((listed, t_list), (submitted, t_submit)):
                assert_503(response, "database_timeout")
                assert elapsed < 1 + 10, elapsed
            # The step returns now; its checkpoint meets the lock and is cancelled.
            (shared / "stmt.release").touch()
            wait_for_sync(
                lambda: '"database fault; giving the run back"' in worker_log.read_text(),
                timeout=30,
                what="the worker gave the run back",
            )
        assert (await client.get("/runs")).status_code == 200
        retried = await client.post("/runs", json=submission(key))
        assert retried.status_code == 201, retried.text  # the 503 stored nothing

        async def finished(run_id: str) -> dict[str, Any] | None:
            body: dict[str, Any] = (await client.get(f"/runs/{run_id}")).json()
            return body if body["status"] in ("completed", "failed") else None

        for run_id in (held_id, retried.json()["run_id"]):

            async def done(r: str = run_id) -> dict[str, Any] | None:
                return await finished(r)

            run = await wait_for(done, timeout=60, what="run finished")
            assert run["status"] == "completed", run
    assert worker.poll() is None, "the worker died"
    log = worker_log.read_text()
    assert '"fault": "statement_timeout"' in log, log[-3000:]
    assert "execution crashed" not in log, log[-3000:]


# --- deadlock past the retries ------------------------------------------------------------


@PG_ONLY
async def test_a_deadlock_past_the_retries_is_503_not_500(
    database_url: str, tmp_path: Path, start_api: Callable[[dict[str, str]], Stack]
) -> None:
    """A deadlock the retries did not clear is a 503 database_conflict.

    ``TREADLE_DB_RETRY_ATTEMPTS=1``: a cancel that PostgreSQL aborts as a deadlock victim
    answers 503 database_conflict with Retry-After, changes nothing, and the client's
    retry succeeds.
    """
    api = start_api({"TREADLE_DB_RETRY_ATTEMPTS": "1"})
    api.start_worker()
    async with httpx.AsyncClient(base_url=api.url, headers=AUTH, timeout=60) as client:
        created = await client.post(
            "/runs", json={"workflow": "acc-approve", "input": {"name": "deadlock"}}
        )
        run_id = created.json()["run_id"]

        async def waiting() -> bool:
            body = (await client.get(f"/runs/{run_id}")).json()
            return bool(body["status"] == "waiting_approval")

        await wait_for(waiting, timeout=60, what="run waiting for its approval")
        # The cancel locks the run row, then the waiting step's row; the API's cancel is
        # made the victim (tests.helpers.Deadlock says how).
        async with Deadlock(dsn(database_url)) as cycle:
            await cycle.hold(
                "SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE",
                "SELECT 1 FROM steps WHERE run_id = $1 FOR UPDATE",
                uuid.UUID(run_id),
            )
            cancel = asyncio.create_task(
                client.post(f"/runs/{run_id}/cancel", json={"reason": "test"})
            )
            await cycle.close("SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE", uuid.UUID(run_id))
        assert_503(await cancel, "database_conflict")
        assert (await client.get(f"/runs/{run_id}")).json()["status"] == "waiting_approval"
        again = await client.post(f"/runs/{run_id}/cancel", json={"reason": "test"})
        assert (again.status_code, again.json()["status"]) == (200, "cancelled")
    assert '"unhandled error"' not in api.logs[0].read_text()


# --- faults by SQLSTATE class: lock timeout, disk full, terminated backend -------------------

_FAULT_SWITCH = """
CREATE TABLE fault_switch (code text NOT NULL);
CREATE FUNCTION fault_switched() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE c text;
BEGIN
  SELECT code INTO c FROM fault_switch LIMIT 1;
  IF c = 'sleep' THEN
    PERFORM pg_sleep(60);
  ELSIF c IS NOT NULL THEN
    RAISE EXCEPTION 'simulated fault' USING ERRCODE = c;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fault_on_runs BEFORE INSERT ON runs
  FOR EACH ROW EXECUTE FUNCTION fault_switched();
CREATE TRIGGER fault_on_steps BEFORE INSERT OR UPDATE ON steps
  FOR EACH ROW EXECUTE FUNCTION fault_switched();
DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I SET lock_timeout = ''500ms''', current_database());
END $$;
"""


def assert_no_sql(response: httpx.Response) -> None:
    text = response.text
    for fragment in ("INSERT", "SELECT", "UPDATE", "[SQL", "[parameters", "simulated fault"):
        assert fragment not in text, text


@pytest.mark.timeout(300)  # several interpreters start on a loaded machine
@PG_ONLY
async def test_database_faults_of_any_class_answer_503_and_store_nothing(
    database_url: str, tmp_path: Path, start_api: Callable[[dict[str, str]], Stack]
) -> None:
    """Lock timeout (55P03), disk full (53100), internal and I/O errors, a terminated backend.

    Each answers ``POST /runs`` with 503 and ``Retry-After``, a problem detail without SQL,
    and stores nothing: once the fault is gone the same request creates the run, once.
    """
    observer = await asyncpg.connect(dsn(database_url))
    await observer.execute(_FAULT_SWITCH)  # before the API connects: lock_timeout applies
    await register_handlers(database_url, tmp_path)
    api = start_api({})
    try:
        async with httpx.AsyncClient(base_url=api.url, headers=AUTH, timeout=90) as client:
            cases = [
                ("53100", "database_unavailable"),  # disk_full
                ("53200", "database_unavailable"),  # out_of_memory
                ("XX000", "database_unavailable"),  # internal_error
                ("58030", "database_unavailable"),  # io_error
                ("72000", "database_unavailable"),  # snapshot_too_old: in no list
            ]
            for code, problem_code in cases:
                key = f"class-{code}-{uuid.uuid4().hex[:6]}"
                await observer.execute("INSERT INTO fault_switch VALUES ($1)", code)
                refused = await client.post("/runs", json=submission(key))
                await observer.execute("DELETE FROM fault_switch")
                assert_503(refused, problem_code)
                assert_no_sql(refused)
                assert (
                    await observer.fetchval(
                        "SELECT count(*) FROM runs WHERE idempotency_key = $1", key
                    )
                    == 0
                )
                accepted = await client.post("/runs", json=submission(key))
                assert accepted.status_code == 201, accepted.text

            # lock_timeout for real: the table is locked, the insert gives up after 500 ms.
            key = f"locked-{uuid.uuid4().hex[:6]}"
            async with runs_table_locked(database_url):
                refused = await client.post("/runs", json=submission(key))
            assert_503(refused, "database_timeout")
            assert_no_sql(refused)
            assert (await client.post("/runs", json=submission(key))).status_code == 201

            # 57P01 for real: the request's backend is terminated mid-statement.
            key = f"killed-{uuid.uuid4().hex[:6]}"
            await observer.execute("INSERT INTO fault_switch VALUES ('sleep')")
            pending = asyncio.create_task(client.post("/runs", json=submission(key)))

            async def sleeping() -> int | None:
                pid: int | None = await observer.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()"
                )
                return pid

            pid = await wait_for(sleeping, timeout=30, what="the request inside the trigger")
            await observer.execute("DELETE FROM fault_switch")
            assert await observer.fetchval("SELECT pg_terminate_backend($1)", pid)
            refused = await pending
            assert_503(refused, "database_unavailable")
            assert_no_sql(refused)
            assert (await client.post("/runs", json=submission(key))).status_code == 201
        log = api.logs[-1].read_text()
        assert '"unhandled error"' not in log, log[-3000:]
    finally:
        await observer.close()


@pytest.mark.timeout(300)  # several interpreters start on a loaded machine
@PG_ONLY
async def test_a_worker_checkpoint_meeting_disk_full_gives_the_run_back(
    database_url: str, tmp_path: Path, start_api: Callable[[dict[str, str]], Stack]
) -> None:
    """A real worker process: the step's checkpoint meets 53100; the run completes later.

    No dead letter, no failed step; the worker logs the fault by name and stays up.
    """
    observer = await asyncpg.connect(dsn(database_url))
    await observer.execute(_FAULT_SWITCH)
    api = start_api({})
    worker = api.start_worker()
    worker_log = api.logs[-1]
    shared = Path(api.env["TREADLE_TEST_DIR"])
    name = f"full-{uuid.uuid4().hex[:6]}"
    try:
        async with httpx.AsyncClient(base_url=api.url, headers=AUTH, timeout=60) as client:
            created = await client.post(
                "/runs", json={"workflow": "acc-hold", "input": {"name": name}}
            )
            assert created.status_code == 201, created.text
            run_id = created.json()["run_id"]
            wait_for_sync(
                lambda: any(shared.glob(f"{name}.started.*")), timeout=30, what="step started"
            )
            await observer.execute("INSERT INTO fault_switch VALUES ('53100')")
            # The step returns; its checkpoint fails: the UPDATE of its start record, or,
            # for an attempt quicker than TREADLE_STEP_START_RECORD_AFTER_SECONDS, the
            # INSERT of start and result in one (docs/adr/0040-one-commit-per-step.md).
            (shared / f"{name}.release").touch()
            wait_for_sync(
                lambda: '"fault": "insufficient_resources"' in worker_log.read_text(),
                timeout=30,
                what="the worker gave the run back",
            )
            await observer.execute("DELETE FROM fault_switch")

            async def finished() -> dict[str, Any] | None:
                body: dict[str, Any] = (await client.get(f"/runs/{run_id}")).json()
                return body if body["status"] in ("completed", "failed") else None

            run = await wait_for(finished, timeout=60, what="run finished")
            assert run["status"] == "completed", run
            letters = (await client.get("/dead-letters")).json()["items"]
            assert [d for d in letters if d["run_id"] == run_id] == []
            steps = (await client.get(f"/runs/{run_id}/steps")).json()["items"]
            assert [(s["step_id"], s["status"]) for s in steps] == [
                ("hold", "succeeded"),
                ("finish", "succeeded"),
            ]
    finally:
        await observer.close()
    assert worker.poll() is None, "the worker died"
    assert "execution crashed" not in worker_log.read_text()


# --- heartbeats never wait behind steps for a connection -----------------------------------


@pytest.mark.timeout(300)  # several interpreters start on a loaded machine
@PG_ONLY
async def test_heartbeats_renew_leases_while_steps_hold_the_whole_pool(
    database_url: str, tmp_path: Path, start_api: Callable[[dict[str, str]], Stack]
) -> None:
    """Two transactional steps hold both connections of a worker's pool past the lease TTL.

    Its heartbeats have a connection of their own, so both leases keep being renewed by
    that worker (same fence) although a second worker stands ready to take expired ones;
    the runs complete on their first claim and the plain step after each ran once.
    """
    api = start_api({})
    holder = api.start_worker(
        handlers="tests.acceptance.pool_handlers",
        concurrency=2,
        extra_env={"TREADLE_DB_POOL_SIZE": "2", "TREADLE_DB_POOL_TIMEOUT_SECONDS": "30"},
    )
    shared = Path(api.env["TREADLE_TEST_DIR"])
    ttl = float(api.env["TREADLE_LEASE_TTL_SECONDS"])
    names = [f"pool-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    observer = await asyncpg.connect(dsn(database_url))
    try:
        async with httpx.AsyncClient(base_url=api.url, headers=AUTH, timeout=60) as client:
            run_ids = []
            for name in names:
                created = await client.post(
                    "/runs", json={"workflow": "acc-tx-hold", "input": {"name": name}}
                )
                assert created.status_code == 201, created.text
                run_ids.append(uuid.UUID(created.json()["run_id"]))
            started = [shared / f"{name}.started.{holder.pid}" for name in names]
            wait_for_sync(
                lambda: all(p.exists() for p in started),
                timeout=60,
                what="both steps holding a connection",
            )
            claimed = {
                r["run_id"]: r
                for r in await observer.fetch(
                    "SELECT run_id, fence, lease_expires_at FROM runs WHERE run_id = ANY($1)",
                    run_ids,
                )
            }
            api.start_worker(handlers="tests.acceptance.pool_handlers")  # ready to take over

            async def renewed_past_a_ttl() -> bool:
                rows = await observer.fetch(
                    "SELECT run_id, fence, lease_owner, lease_expires_at, "
                    "lease_expires_at > now() AS live FROM runs WHERE run_id = ANY($1)",
                    run_ids,
                )
                for r in rows:
                    assert r["fence"] == claimed[r["run_id"]]["fence"], "a lease was taken over"
                    assert f":{holder.pid}:" in r["lease_owner"], r["lease_owner"]
                return all(
                    r["live"]
                    and (
                        r["lease_expires_at"] - claimed[r["run_id"]]["lease_expires_at"]
                    ).total_seconds()
                    > 2 * ttl
                    for r in rows
                )

            await wait_for(renewed_past_a_ttl, timeout=90, what="leases renewed for 2 TTLs")
            for name in names:
                (shared / f"{name}.release").touch()
            for run_id in run_ids:

                async def finished(r: uuid.UUID = run_id) -> dict[str, Any] | None:
                    body: dict[str, Any] = (await client.get(f"/runs/{r}")).json()
                    return body if body["status"] in ("completed", "failed") else None

                run = await wait_for(finished, timeout=60, what="run finished")
                assert (run["status"], run["attempt"]) == ("completed", 1), run
                assert run["output"] == f"held-by-{holder.pid}+recorded", run
        for name in names:
            assert (shared / f"{name}.calls").read_text().split() == [str(holder.pid)]
    finally:
        await observer.close()


@PG_ONLY
def test_a_worker_process_started_while_the_database_is_down_waits_for_it(
    database_url: str, stack: Stack
) -> None:
    """``treadle worker`` started with its database down waits, then registers and runs.

    Found by the chaos harness's database monkey (a worker restarted during a PostgreSQL
    restart exited with a traceback and ran nothing more). The worker's database is
    reached through a port that refuses connections until the test opens it: the
    process must stay up, logging its retries of the schema check, then announce itself
    and complete a run submitted over HTTP.
    """
    url = make_url(database_url)
    forwarder = TcpForwarder((url.host or "127.0.0.1", url.port or 5432))
    down_url = url.set(port=forwarder.port).render_as_string(hide_password=False)
    proc = stack._spawn(
        ["worker", "--handlers", "tests.acceptance.handlers"],
        "worker",
        {"TREADLE_DATABASE_URL": down_url},
    )
    stack.workers.append(proc)
    log = stack.logs[-1]
    try:

        def retried_twice() -> bool:
            if proc.poll() is not None:  # the defect: the process exited
                raise AssertionError(f"worker exited: {log.read_text()[-3000:]}")
            lines = [json.loads(line) for line in log.read_text().splitlines() if line[:1] == "{"]
            retries = [e for e in lines if e["event"] == "database fault at start; retrying"]
            return len(retries) >= 2 and {e["what"] for e in retries} == {"schema check"}

        # Generous: the interpreter alone takes ~25 s to start on a loaded 2-core box.
        wait_for_sync(retried_twice, timeout=90, what="two refused schema checks")
        forwarder.open()  # the database is back

        def announced() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited: {log.read_text()[-3000:]}")
            return WORKER_READY in log.read_bytes()

        wait_for_sync(announced, timeout=60, what="the worker's ready line")
        with stack.client() as c:
            r = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": [1, "a"]}})
            assert r.status_code == 201, r.text
            run_id = r.json()["run_id"]

            def finished() -> dict[str, Any] | None:
                body: dict[str, Any] = c.get(f"/runs/{run_id}").json()
                return body if body["status"] in ("completed", "failed") else None

            body = wait_for_sync(finished, timeout=60, what="the run to finish")
        assert (body["status"], body["output"]) == ("completed", [1, "a"])
    finally:
        stack.stop()  # the worker first: it holds connections through the forwarder
        forwarder.close()
