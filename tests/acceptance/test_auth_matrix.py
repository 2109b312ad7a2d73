"""The generated authorization matrix, against a real ``treadle serve`` in jwt mode.

Endpoints are enumerated from the app's own routes (every route that authenticates), so
a new endpoint is covered without editing this file, unless it has a path parameter or a
body this file does not know: then the test fails and says what to add. Each endpoint is
called with every case below; each call must give the exact status, a problem+json body,
and change nothing in the database (row counts of every table, the target run's fence and
status). Keys are RS256, generated here and served by a JWKS server on 127.0.0.1.

Tenant ``initech`` is suspended before the matrix runs: every endpoint answers its
principals ``403 tenant_suspended`` naming the tenant (never the operator's reason) and
changes nothing, while its ``admin`` principals still get in.

A revoked API key's queued run ends ``failed`` / ``failure_authorization`` with a real
worker process; the key is created and revoked with the ``treadle api-keys`` CLI.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from joserfc import jwt
from joserfc.jwk import RSAKey
from pydantic import BaseModel
from sqlalchemy import func, select

from app.api.app import create_app
from app.api.deps import get_principal
from app.auth.principal import Scope
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries import dead_letters as dl_q
from app.db.tables import metadata, runs
from app.engine.registry import Registry
from app.sdk import WorkflowContext, workflow
from tests.acceptance.conftest import Stack, token
from tests.acceptance.conftest import cli as _cli
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync
from tests.unit.test_jwt import Jwks

ISS = "https://idp.matrix.test/"
AUD = "treadle-matrix"
KID = "matrix-1"
TENANT, OTHER, SUSPENDED = "acme", "globex", "initech"
SUSPENSION_REASON = "matrix: invoice unpaid"
OWNER, COLLEAGUE = "alice", "bob"
NON_ADMIN = [s.value for s in Scope if s != Scope.ADMIN]
EVERY = [s.value for s in Scope]

CASES_401 = (
    "no token",
    "malformed",
    "expired",
    "not yet valid",
    "wrong issuer",
    "wrong audience",
    "alg none",
    "HS256 signed with the RSA public key",
    "unknown kid",
    "revoked API key",
)
CASES = (
    *CASES_401,
    "missing scope",
    "suspended tenant",
    "other tenant",
    "owner policy violation",
)

# Values for path parameters, by name. A new route with another parameter fails below.
STEP_ID, SIGNAL = "approve-1", "go"
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/runs"): {"workflow": "matrix-owned", "input": {"n": 1}},
    ("POST", "/runs:batch"): {"runs": [{"workflow": "matrix-owned", "input": {"n": 1}}]},
    ("POST", "/runs/{run_id}/cancel"): {"reason": "matrix"},
    ("POST", "/runs/{run_id}/signals/{name}"): {"payload": 1},
    ("POST", "/runs/{run_id}/approvals/{step_id}"): {"decision": "approve"},
    ("POST", "/runs/{run_id}/resume"): None,
    ("POST", "/runs/{run_id}/retry"): {"reason": "matrix"},
    ("POST", "/runs/{run_id}/pause"): {"reason": "matrix"},
    # Dry runs: the matrix checks who may ask; the batch engine has its own tests.
    ("POST", "/runs:cancel"): {"filter": {"workflow": "matrix-owned"}, "dry_run": True},
    ("POST", "/runs:retry"): {"filter": {"workflow": "matrix-owned"}, "dry_run": True},
    ("POST", "/runs:resume"): {"filter": {"workflow": "matrix-owned"}, "dry_run": True},
    ("POST", "/runs:pause"): {"filter": {"workflow": "matrix-owned"}, "dry_run": True},
    ("POST", "/runs:unpause"): {"filter": {"workflow": "matrix-owned"}, "dry_run": True},
    ("POST", "/runs:signal"): {
        "filter": {"workflow": "matrix-owned"},
        "dry_run": True,
        "name": "go",
    },
    ("POST", "/batches/{batch_id}/cancel"): None,
    ("POST", "/runs/{run_id}/unpause"): None,
    ("POST", "/runs/{run_id}/rerun"): {"from_step": "matrix-step"},
    ("POST", "/dead-letters/{dead_letter_id}/requeue"): {"reason": "matrix"},
    ("POST", "/admin/api-keys"): {"name": "matrix", "scopes": ["runs:read"]},
    ("DELETE", "/admin/api-keys/{key_id}"): None,
    ("POST", "/runs/{run_id}/migrate"): {"version": "2"},
    ("POST", "/admin/maintenance"): {"dry_run": True},
    ("POST", "/schedules"): {
        "name": "matrix-new",
        "workflow": "matrix-owned",
        "input": {"n": 1},
        "cron": "0 0 1 1 *",
    },
    ("PATCH", "/schedules/{schedule_id}"): {"jitter_seconds": 1},
    ("POST", "/schedules/{schedule_id}/pause"): None,
    ("POST", "/schedules/{schedule_id}/resume"): None,
    ("POST", "/schedules/{schedule_id}/trigger"): None,
    ("POST", "/admin/tenants/{tenant}/suspend"): {"reason": "matrix"},
    ("POST", "/admin/tenants/{tenant}/resume"): None,
    ("POST", "/webhooks"): {"url": "http://127.0.0.1:9/matrix"},
    ("POST", "/events"): {"name": "matrix.posted", "data": {"n": 1}},
}
# Endpoints that create something in the caller's own tenant, or act on the whole
# deployment (maintenance, tenants): "other tenant" and "owner" do not apply (there is no
# one else's object to reach; any tenant's admin may suspend any tenant).
CREATES = {
    ("POST", "/runs"),
    ("POST", "/runs:batch"),
    ("POST", "/webhooks"),
    ("POST", "/events"),
    ("POST", "/admin/api-keys"),
    ("POST", "/schedules"),
    ("POST", "/admin/maintenance"),
    ("GET", "/admin/tenants"),
    ("POST", "/admin/tenants/{tenant}/suspend"),
    ("POST", "/admin/tenants/{tenant}/resume"),
    # A bulk action selects among the caller's own runs (a dry run creates nothing).
    ("POST", "/runs:cancel"),
    ("POST", "/runs:retry"),
    ("POST", "/runs:resume"),
    ("POST", "/runs:pause"),
    ("POST", "/runs:unpause"),
    ("POST", "/runs:signal"),
}


class Nothing(BaseModel):
    n: int = 0


@workflow("matrix-owned", access="owner")
async def matrix_owned(ctx: WorkflowContext, inp: Nothing) -> int:
    """Never executed here: the matrix runs without a worker so nothing moves."""
    return inp.n


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    scope: Scope
    params: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def targets_an_object(self) -> bool:
        return any(p.endswith("_id") and p != "step_id" for p in self.params)


def _auth_of(dependant: Any) -> tuple[bool, Scope | None]:
    """(authenticates?, required scope) from a route's dependency tree."""
    authenticated, scope = False, None
    stack = list(dependant.dependencies)
    while stack:
        dep = stack.pop()
        authenticated |= dep.call is get_principal
        found = getattr(dep.call, "required_scope", None)
        scope = Scope(found) if found is not None else scope
        stack.extend(dep.dependencies)
    return authenticated, scope


def _routes(routes: list[Any]) -> Iterator[tuple[str, set[str], Any]]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route.path, set(route.methods or ()), route.dependant
        elif hasattr(route, "effective_route_contexts"):  # FastAPI's included routers
            for ctx in route.effective_route_contexts():
                yield ctx.path, set(ctx.methods or ()), ctx.dependant


def authenticated_endpoints() -> list[Endpoint]:
    """Every route of the app that authenticates, with the scope it needs."""
    app = create_app(
        Settings(database_url="sqlite+aiosqlite:///:memory:", dev_secret=DEV_SECRET),
        check_schema_on_start=False,
    )
    found = []
    for path, methods, dependant in _routes(app.routes):
        authenticated, scope = _auth_of(dependant)
        if not authenticated:
            continue  # probes, metrics, OpenAPI pages: no token
        if path == "/whoami":
            continue  # any valid token may ask who it is, by design (tests/console)
        assert scope is not None, f"{path} authenticates but requires no scope"
        for method in sorted(methods - {"HEAD"}):
            found.append(Endpoint(method, path, scope, tuple(re.findall(r"{(\w+)}", path))))
    return found


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Tokens:
    """RS256 tokens of the local identity provider, and the forged ones."""

    key: RSAKey = field(default_factory=lambda: RSAKey.generate_key(2048, parameters={"kid": KID}))

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        return {
            "iss": ISS,
            "aud": AUD,
            "sub": OWNER,
            "tenant": TENANT,
            "scope": " ".join(EVERY),
            "iat": now,
            "exp": now + 600,
            **overrides,
        }

    def sign(self, key: RSAKey | None = None, kid: str = KID, **overrides: Any) -> str:
        return jwt.encode({"alg": "RS256", "kid": kid}, self.claims(**overrides), key or self.key)

    def valid(self, tenant: str, subject: str, scopes: list[str]) -> str:
        return self.sign(tenant=tenant, sub=subject, scope=" ".join(scopes))

    def forged(self, case: str) -> str | None:
        now = int(time.time())
        if case == "no token":
            return None
        if case == "malformed":
            return "not-a-jwt.at all"
        if case == "expired":
            return self.sign(exp=now - 3600, iat=now - 7200)
        if case == "not yet valid":
            return self.sign(nbf=now + 3600)
        if case == "wrong issuer":
            return self.sign(iss="https://evil.test/")
        if case == "wrong audience":
            return self.sign(aud="another-api")
        if case == "alg none":
            head = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
            return f"{head}.{b64(json.dumps(self.claims()).encode())}."
        if case == "HS256 signed with the RSA public key":
            head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": KID}).encode())
            body = b64(json.dumps(self.claims()).encode())
            secret = self.key.as_pem(private=False)
            mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
            return f"{head}.{body}.{b64(mac)}"
        if case == "unknown kid":
            stranger = RSAKey.generate_key(2048, parameters={"kid": "nobody"})
            return self.sign(stranger, kid="nobody")
        raise AssertionError(case)


@dataclass
class World:
    """What the matrix points at: tenant acme's owner-policy run and its objects."""

    run_id: str
    dead_letter_id: str
    key_id: str
    revoked_key: str
    schedule_id: str
    batch_id: str
    webhook_id: str
    event_id: str

    def fill(self, endpoint: Endpoint, *, missing: bool = False) -> str:
        values = {
            "run_id": self.run_id,
            "dead_letter_id": self.dead_letter_id,
            "key_id": self.key_id,
            "schedule_id": self.schedule_id,
            "batch_id": self.batch_id,
            "webhook_id": self.webhook_id,
            "event_id": self.event_id,
            "step_id": STEP_ID,
            "name": SIGNAL,
            "tenant": TENANT,
        }
        path = endpoint.path
        for param in endpoint.params:
            assert param in values, f"add a value for path parameter {param!r} ({endpoint.label})"
            value = str(uuid.uuid4()) if missing and param.endswith("_id") else values[param]
            if param == "step_id":
                value = STEP_ID
            path = path.replace("{" + param + "}", value)
        return path

    @property
    def ids(self) -> list[str]:
        return [
            self.run_id,
            self.dead_letter_id,
            self.key_id,
            self.schedule_id,
            self.batch_id,
            self.webhook_id,
            self.event_id,
        ]


async def snapshot(db: Database, run_id: str) -> dict[str, Any]:
    """Row counts of every table, and the target run's fence and status."""
    state: dict[str, Any] = {}
    async with db.read() as conn:
        for table in metadata.sorted_tables:
            count = await conn.execute(select(func.count()).select_from(table))
            state[table.name] = count.scalar()
        row = (
            await conn.execute(
                select(runs.c.fence, runs.c.status).where(runs.c.run_id == uuid.UUID(run_id))
            )
        ).one()
    state["run.fence"], state["run.status"] = row
    return state


def _normalise(body: dict[str, Any], world: World) -> dict[str, Any]:
    text = json.dumps({k: v for k, v in body.items() if k != "instance"})
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", text)
    normalised: dict[str, Any] = json.loads(text)
    return normalised


@pytest.fixture
async def matrix_stack(
    database_url: str, tmp_path: Path, stack_env: dict[str, str]
) -> AsyncIterator[tuple[Stack, Tokens, Database]]:
    jwks = Jwks()
    tokens = Tokens()
    jwks.keys = [tokens.key]
    env = {
        **stack_env,
        "TREADLE_AUTH_MODE": "jwt",
        "TREADLE_JWT_ISSUER": ISS,
        "TREADLE_JWT_AUDIENCE": AUD,
        "TREADLE_JWT_JWKS_URL": jwks.url,
        # The seeded webhook endpoint is on 127.0.0.1 (nothing is ever sent: no worker).
        "TREADLE_WEBHOOK_ALLOW_PRIVATE": "true",
    }
    stack = Stack(database_url=database_url, tmp=tmp_path, env=env)
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    try:
        stack.start_api()
        yield stack, tokens, db
    finally:
        stack.stop()
        await db.dispose()
        jwks.close()


async def _seed(stack: Stack, tokens: Tokens, db: Database) -> World:
    async with db.write() as conn:
        await Registry([matrix_owned]).register(conn)
    owner = tokens.valid(TENANT, OWNER, NON_ADMIN)
    admin = tokens.valid(TENANT, "root", EVERY)
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as c:
        created = await c.post(
            "/runs",
            json={"workflow": "matrix-owned", "input": {"n": 7}},
            headers={"Authorization": f"Bearer {owner}"},
        )
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        keys = []
        for name in ("live", "revoked"):
            resp = await c.post(
                "/admin/api-keys",
                json={"name": name, "scopes": EVERY},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert resp.status_code == 201, resp.text
            keys.append(resp.json())
        revoked = await c.delete(
            f"/admin/api-keys/{keys[1]['key_id']}", headers={"Authorization": f"Bearer {admin}"}
        )
        assert revoked.status_code == 200
        schedule = await c.post(
            "/schedules",
            json={
                "name": "matrix",
                "workflow": "matrix-owned",
                "input": {"n": 1},
                "cron": "0 0 1 1 *",
                "paused": True,
            },
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert schedule.status_code == 201, schedule.text
        # A batch that leaves the run as it is (it is not paused: skipped).
        batch = await c.post(
            "/runs:unpause",
            json={"run_ids": [run_id]},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert batch.status_code == 202, batch.text
        suspended = await c.post(
            f"/admin/tenants/{SUSPENDED}/suspend",
            json={"reason": SUSPENSION_REASON},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert suspended.status_code == 200, suspended.text
        webhook = await c.post(
            "/webhooks",
            json={"url": "http://127.0.0.1:9/seeded"},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert webhook.status_code == 201, webhook.text
        # An event no workflow is triggered by: it starts nothing, it is just acme's.
        event = await c.post(
            "/events",
            json={"name": "matrix.seeded", "data": {"n": 0}},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert event.status_code == 201, event.text
    async with db.write() as conn:
        dl_id = await dl_q.insert_dead_letter(
            conn,
            run_id=uuid.UUID(run_id),
            tenant_id=TENANT,
            workflow="matrix-owned",
            reason="failure_non_retryable",
            error=None,
        )
    return World(
        run_id=run_id,
        dead_letter_id=str(dl_id),
        key_id=keys[0]["key_id"],
        revoked_key=keys[1]["api_key"],
        schedule_id=schedule.json()["schedule_id"],
        batch_id=batch.json()["batch_id"],
        webhook_id=webhook.json()["webhook_id"],
        event_id=event.json()["event_id"],
    )


def _case_token(case: str, endpoint: Endpoint, tokens: Tokens, world: World) -> str | None:
    scope = endpoint.scope.value
    if case in CASES_401:
        return world.revoked_key if case == "revoked API key" else tokens.forged(case)
    if case == "missing scope":
        return tokens.valid(TENANT, OWNER, [s for s in NON_ADMIN if s != scope])
    if case == "suspended tenant":
        # Every scope but admin (admin principals are exempt, checked separately).
        return tokens.valid(SUSPENDED, OWNER, NON_ADMIN)
    if case == "other tenant":
        return tokens.valid(OTHER, OWNER, [scope])
    if case == "owner policy violation":
        return tokens.valid(TENANT, COLLEAGUE, [scope])
    raise AssertionError(case)


def _applies(case: str, endpoint: Endpoint) -> bool:
    key = (endpoint.method, endpoint.path)
    if case == "other tenant":
        return key not in CREATES
    if case == "owner policy violation":
        # Admin endpoints are not subject to the owner policy (admin sees every owner).
        # The seeded schedule is of an owner-policy workflow: its creator's alone.
        # Webhook endpoints and posted events are the tenant's, not a subject's: no owner
        # policy applies to them (the runs an event started are filtered, see test_events).
        return (
            key not in CREATES
            and endpoint.scope not in (Scope.ADMIN, Scope.WEBHOOKS_MANAGE)
            and not endpoint.path.startswith("/events")
        )
    return True


async def test_authorization_matrix(
    matrix_stack: tuple[Stack, Tokens, Database],
) -> None:
    stack, tokens, db = matrix_stack
    world = await _seed(stack, tokens, db)
    endpoints = authenticated_endpoints()
    assert len(endpoints) >= 18, [e.label for e in endpoints]
    failures: list[str] = []
    counts: dict[str, int] = dict.fromkeys(CASES, 0)

    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as c:

        async def call(endpoint: Endpoint, tok: str | None, path: str) -> httpx.Response:
            key = (endpoint.method, endpoint.path)
            if endpoint.method in ("POST", "PUT", "PATCH") and key not in BODIES:
                raise AssertionError(f"add a valid body for {endpoint.label} to BODIES")
            body = BODIES.get(key)
            headers = {"Authorization": f"Bearer {tok}"} if tok is not None else {}
            return await c.request(
                endpoint.method,
                path,
                headers=headers,
                **({"json": body} if body is not None else {}),
            )

        # Control: the same provider's valid tokens are accepted on every read.
        for endpoint in endpoints:
            if endpoint.method == "GET":
                owner = tokens.valid(TENANT, OWNER, EVERY)
                resp = await call(endpoint, owner, world.fill(endpoint))
                if resp.status_code not in (200, 202):
                    failures.append(f"control {endpoint.label}: {resp.status_code} {resp.text}")
        # Control: the suspended tenant's admin principals are not locked out.
        suspended_admin = tokens.valid(SUSPENDED, "root", EVERY)
        for path in ("/runs", "/admin/tenants", "/dead-letters"):
            resp = await c.get(path, headers={"Authorization": f"Bearer {suspended_admin}"})
            if resp.status_code != 200:
                failures.append(f"suspended admin GET {path}: {resp.status_code} {resp.text}")

        for endpoint in endpoints:
            for case in CASES:
                if not _applies(case, endpoint):
                    continue
                counts[case] += 1
                where = f"{endpoint.label} × {case}"
                before = await snapshot(db, world.run_id)
                tok = _case_token(case, endpoint, tokens, world)
                resp = await call(endpoint, tok, world.fill(endpoint))
                after = await snapshot(db, world.run_id)
                if before != after:
                    failures.append(f"{where}: database changed {before} -> {after}")
                failures.extend(
                    f"{where}: {problem}"
                    for problem in await _check(case, endpoint, resp, world, call, tok)
                )
    total = sum(counts.values())
    print(f"matrix: {len(endpoints)} endpoints × {len(CASES)} cases = {total} cells; {counts}")
    assert not failures, "\n".join(failures[:40]) + f"\n({len(failures)} failures)"


async def _check(
    case: str,
    endpoint: Endpoint,
    resp: httpx.Response,
    world: World,
    call: Callable[..., Any],
    tok: str | None,
) -> list[str]:
    problems: list[str] = []
    is_problem = resp.headers.get("content-type", "").startswith("application/problem+json")

    def expect(status: int, code: str | None = None) -> None:
        if resp.status_code != status:
            problems.append(f"status {resp.status_code} != {status}: {resp.text[:300]}")
            return
        if not is_problem:
            problems.append(f"not problem+json: {resp.headers.get('content-type')}")
            return
        body = resp.json()
        if body.get("status") != status or not body.get("type", "").startswith("urn:treadle:"):
            problems.append(f"bad problem body {body}")
        if code is not None and body.get("code") != code:
            problems.append(f"code {body.get('code')} != {code}")

    if case in CASES_401:
        expect(401, "unauthenticated")
        if not resp.headers.get("www-authenticate", "").startswith("Bearer"):
            problems.append("no WWW-Authenticate: Bearer header")
    elif case == "missing scope":
        expect(403, "forbidden")
        if not problems and resp.json().get("required_scope") != endpoint.scope.value:
            problems.append(f"required_scope {resp.json().get('required_scope')}")
    elif case == "suspended tenant":
        expect(403, "tenant_suspended")
        if not problems:
            body = {k: v for k, v in resp.json().items() if k != "instance"}
            wanted = {
                "type": "urn:treadle:problem:tenant_suspended",
                "title": "Forbidden",
                "status": 403,
                "detail": f"tenant {SUSPENDED!r} is suspended",
                "code": "tenant_suspended",
                "tenant": SUSPENDED,
            }
            if body != wanted:
                problems.append(f"problem body {body} != {wanted}")
    elif endpoint.params and endpoint.targets_an_object:
        # Another tenant's (or owner's) object: the same 404 as for an id that never existed.
        expect(404)
        missing = await call(endpoint, tok, world.fill(endpoint, missing=True))
        if not problems and _normalise(resp.json(), world) != _normalise(missing.json(), world):
            problems.append(f"404 differs from a missing id: {resp.text} vs {missing.text}")
    else:
        # A list: allowed, but shows nothing of acme's (or of alice's owner-policy run).
        if resp.status_code != 200:
            problems.append(f"list status {resp.status_code}: {resp.text[:300]}")
        leaked = [i for i in world.ids if i in resp.text]
        if leaked:
            problems.append(f"list leaks {leaked}")
    return problems


# --- a revoked key's queued run, with a real worker and the CLI ------------------------


@pytest.fixture
def dev_stack(database_url: str, tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    s = Stack(database_url=database_url, tmp=tmp_path, env=stack_env)
    s.start_api()
    try:
        yield s
    finally:
        s.stop()


async def test_revoked_keys_queued_run_fails_authorization(
    dev_stack: Stack, database_url: str
) -> None:
    env = dev_stack.env
    created = _cli(
        env,
        "api-keys",
        "create",
        "--tenant",
        "acme",
        "--name",
        "ci",
        "--scopes",
        "runs:write,runs:read",
    )
    key = created.strip().splitlines()[-1]
    key_id = re.search(r"key_id\s+(\S+)", created)
    assert key.startswith("trd_") and key_id is not None
    db = Database(Settings(database_url=database_url, dev_secret=DEV_SECRET))
    try:
        async with db.write() as conn:
            await Registry.from_modules(["tests.acceptance.handlers"]).register(conn)
    finally:
        await db.dispose()
    with dev_stack.client(key) as c:
        resp = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": "classified"}})
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["run_id"]
        assert resp.json()["status"] == "queued"
    listed = _cli(env, "api-keys", "list", "--tenant", "acme")
    assert "active" in listed and key not in listed
    _cli(env, "api-keys", "revoke", key_id.group(1), "--tenant", "acme")
    assert "revoked" in _cli(env, "api-keys", "list", "--tenant", "acme")
    dev_stack.start_worker()
    reader = token(tenant="acme", subject="carol")
    with dev_stack.client(reader) as c:
        run = wait_for_sync(
            lambda: (b := c.get(f"/runs/{run_id}").json())["status"] == "failed" and b,
            timeout=60,
            what="run failed",
        )
        assert run["reason"] == "failure_authorization"
        assert run["redacted"] is True and run["input"] is None
        letters = c.get("/dead-letters").json()["items"]
        assert [d["reason"] for d in letters if d["run_id"] == run_id] == ["failure_authorization"]
        report = c.get(f"/runs/{run_id}/report", params={"format": "text"}).text
        assert "classified" not in report and "failure_authorization" in report
    # The CLI revoked it (another process): the API refuses it within its verified-token
    # cache window, TREADLE_AUTH_CACHE_TTL_SECONDS (docs/security.md#token-cache).
    with dev_stack.client(key) as c:
        wait_for_sync(
            lambda: c.get("/runs").status_code == 401, timeout=60, what="revoked key refused"
        )
