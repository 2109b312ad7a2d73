"""Every curl line in README.md and docs/api.md runs against a live server and succeeds.

The commands are taken from the fenced ``sh`` blocks as written (a command ends where its
quotes close and no trailing backslash continues it). Shell variables the docs use
(``$TREADLE_URL``, ``$TREADLE_TOKEN``, ``$H``, ``$J``, ``$RUN_ID``, …) and the README's
``<run_id>`` placeholder are filled in per command with a run in the state the command
needs (a waiting run to cancel or resume, a failed run to retry, …). A command that
answers 4xx/5xx, or a variable the test does not know, fails the test: the docs stay true.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.auth.dev import DevTokens
from tests.acceptance.conftest import ROOT, Stack, token
from tests.conftest import DEV_SECRET
from tests.helpers import wait_for_sync

DOCS = [ROOT / "README.md", ROOT / "docs" / "api.md"]
STATUS_MARK = "\n__HTTP_STATUS__"
# What `treadle token` grants by default: the docs' $TREADLE_TOKEN.
DEFAULT_SCOPES = [
    "runs:write",
    "runs:read",
    "runs:cancel",
    "approvals:write",
    "signals:write",
    "events:write",
]


def curl_commands(path: Path) -> list[str]:
    """The curl commands of ``path``'s fenced sh blocks, each as its source text."""
    blocks = re.findall(r"^```sh\n(.*?)^```", path.read_text(), re.MULTILINE | re.DOTALL)
    commands: list[str] = []
    for block in blocks:
        pending: list[str] = []
        for line in block.splitlines():
            if not pending and not line.lstrip().startswith("curl "):
                continue
            pending.append(line)
            text = "\n".join(pending)
            if text.rstrip().endswith("\\"):
                continue
            try:
                shlex.split(text, comments=True)
            except ValueError:  # a quote is still open: the command goes on
                continue
            commands.append(text)
            pending = []
        assert not pending, f"{path.name}: unterminated curl command {pending}"
    return commands


def test_the_docs_have_curl_commands() -> None:
    counts = {p.name: len(curl_commands(p)) for p in DOCS}
    assert counts["README.md"] >= 3 and counts["api.md"] >= 20, counts
    joined = curl_commands(ROOT / "README.md")
    assert any("<run_id>" in c for c in joined)
    assert any("-d '{" in c and "card_token" in c for c in joined), "multi-line body parsed"


_VAR = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def expand(arg: str, env: dict[str, str]) -> str:
    """Expand ``$NAME`` / ``${NAME}`` from ``env``; unknown names fail the test."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in env, f"docs use ${name}, which this test does not provide"
        return env[name]

    return _VAR.sub(sub, arg)


class DocsWorld:
    """Runs in the states the documented commands need, made through the API."""

    def __init__(self, stack: Stack, tok: str) -> None:
        self.api = stack.client(tok)
        self.n = 0

    def submit(self, workflow: str, payload: dict[str, Any]) -> str:
        resp = self.api.post("/runs", json={"workflow": workflow, "input": payload})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["run_id"])

    def reach(self, run_id: str, *statuses: str) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            run: dict[str, Any] = self.api.get(f"/runs/{run_id}").json()
            return run if run["status"] in statuses else None

        return wait_for_sync(probe, timeout=60, what=f"run {run_id} in {statuses}")

    def order(self, card: str = "tok_visa") -> dict[str, Any]:
        self.n += 1
        return {
            "order_id": f"DOCS-{self.n}",
            "customer_email": "ann@example.com",
            "items": [{"sku": "MUG-01", "quantity": 1, "unit_price_cents": 900}],
            "shipping_address": {
                "name": "Ann",
                "line1": "1 Main St",
                "city": "Springfield",
                "postal_code": "12345",
                "country": "US",
            },
            "card_token": card,
        }

    def completed_run(self) -> str:
        run_id = self.submit("orders", self.order())
        self.reach(run_id, "completed")
        return run_id

    def failed_run(self) -> str:
        run_id = self.submit("orders", self.order("tok_declined"))
        self.reach(run_id, "failed")
        return run_id

    def waiting_approval(self) -> str:
        self.n += 1
        applicant = {"customer_id": f"c{self.n}", "company": "Acme", "email": "ops@acme.test"}
        run_id = self.submit("onboarding", applicant)
        self.reach(run_id, "waiting_approval")
        return run_id

    def paused_run(self) -> str:
        run_id = self.waiting_approval()
        resp = self.api.post(f"/runs/{run_id}/pause", json={"reason": "docs"})
        assert resp.status_code == 200, resp.text
        return run_id

    def pending_dead_letter(self) -> str:
        run_id = self.failed_run()
        items = self.api.get("/dead-letters").json()["items"]
        return next(str(d["dead_letter_id"]) for d in items if str(d["run_id"]) == run_id)

    def api_key_id(self, admin_token: str) -> str:
        resp = self.api.post(
            "/admin/api-keys",
            json={"name": f"docs-{self.n}", "scopes": ["runs:read"]},
            headers={"Authorization": f"Bearer {admin_token}"},
        )
        assert resp.status_code == 201, resp.text
        return str(resp.json()["key_id"])

    def migratable_run(self) -> str:
        """A version-1 run waiting on an approval, with version 2 registered."""
        resp = self.api.post(
            "/runs", json={"workflow": "acc-migrate", "version": "1", "input": {"name": "docs"}}
        )
        assert resp.status_code == 201, resp.text
        run_id = str(resp.json()["run_id"])
        self.reach(run_id, "waiting_approval")
        return run_id

    def batch_id(self) -> str:
        """A cancelled batch (cancelling it again, as the docs do, answers 200).

        1000 unknown ids keep a worker busy for several chunks, so the cancel that follows
        the 202 lands before it completes; a batch that completed first is replaced.
        """
        for _ in range(5):
            ids = [str(uuid.uuid4()) for _ in range(1000)]
            resp = self.api.post("/runs:cancel", json={"run_ids": ids, "reason": "docs"})
            assert resp.status_code == 202, resp.text
            batch_id = str(resp.json()["batch_id"])
            if self.api.post(f"/batches/{batch_id}/cancel").status_code == 200:
                return batch_id
        raise AssertionError("every batch completed before it could be cancelled")

    def next_page_token(self) -> str:
        self.completed_run()
        self.completed_run()
        page = self.api.get("/runs", params={"created_after": "2026-11-29T00:00:00Z", "limit": 1})
        tok = page.json()["next_page_token"]
        assert tok
        return str(tok)


def _context(world: DocsWorld, command: str, base: dict[str, str]) -> dict[str, str]:
    """Variables for one command: a run in the state the command acts on."""
    env = dict(base)
    setups: list[tuple[str, Callable[[], dict[str, str]]]] = [
        # Before "/resume": resuming a tenant needs no run (and must not make one).
        ("/admin/tenants", dict),
        ("$BATCH_ID", lambda: {"BATCH_ID": world.batch_id()}),
        ("/cancel", lambda: {"RUN_ID": world.waiting_approval()}),
        ("/signals/", lambda: {"RUN_ID": world.waiting_approval()}),
        ("/approvals/", lambda: {"RUN_ID": world.waiting_approval()}),
        ("/resume", lambda: {"RUN_ID": world.waiting_approval()}),
        ("/retry", lambda: {"RUN_ID": world.failed_run()}),
        ("/pause", lambda: {"RUN_ID": world.waiting_approval()}),
        ("/unpause", lambda: {"RUN_ID": world.paused_run()}),
        ("/rerun", lambda: {"RUN_ID": world.completed_run()}),
        ("/requeue", lambda: {"DEAD_LETTER_ID": world.pending_dead_letter()}),
        ("$NEXT", lambda: {"NEXT": world.next_page_token()}),
        ("/admin/api-keys/$KEY_ID", lambda: {"KEY_ID": world.api_key_id(base["ADMIN_TOKEN"])}),
        ("/migrate", lambda: {"RUN_ID": world.migratable_run()}),
    ]
    for marker, setup in setups:
        if marker in command:
            env.update(setup())
            return env
    env["RUN_ID"] = base["RUN_ID"]
    return env


def run_curl(command: str, env: dict[str, str]) -> tuple[int, str]:
    """Run one documented command (no shell); returns the HTTP status and the output."""
    # Backslash-newline continues a shell line; shlex would keep the newline as a word.
    text = command.replace("\\\n", " ").replace("<run_id>", "$RUN_ID")
    argv = [expand(a, env) for a in shlex.split(text, comments=True)]
    assert argv[0] == "curl"
    proc = subprocess.run(
        [*argv, "--max-time", "60", "-w", STATUS_MARK + "%{http_code}"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, f"curl failed ({proc.returncode}): {proc.stderr}"
    body, _, status = proc.stdout.rpartition(STATUS_MARK)
    return int(status), body


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_documented_curl_commands_succeed(stack: Stack) -> None:
    stack.start_worker(handlers="examples.orders")
    stack.start_worker(handlers="examples.onboarding")
    stack.start_worker(handlers="examples.nightly_report")
    stack.start_worker(handlers="tests.acceptance.handlers")
    user = token(tenant="default", subject="dev", scopes=DEFAULT_SCOPES)
    world = DocsWorld(stack, user)
    base = {
        "TREADLE_URL": stack.url,
        "TREADLE_TOKEN": user,
        "H": f"Authorization: Bearer {user}",
        "J": "Content-Type: application/json",
        "A": "Authorization: Bearer " + token(tenant="default", subject="ops", scopes=["admin"]),
        # The onboarding approval needs the sales-manager group and another subject.
        "APPROVER_TOKEN": DevTokens(DEV_SECRET).mint(
            tenant_id="default",
            subject="maria",
            scopes=["approvals:write"],
            groups=["sales-manager"],
        ),
        "ADMIN_TOKEN": token(tenant="default", subject="ops", scopes=["admin"]),
    }
    with world.api:
        base["RUN_ID"] = world.completed_run()
        ran: list[str] = []
        for doc in DOCS:
            for command in curl_commands(doc):
                env = _context(world, command, base)
                status, body = run_curl(command, env)
                where = f"{doc.name}: {command.splitlines()[0][:100]}"
                assert 200 <= status < 300, f"{where} answered {status}: {body[-800:]}"
                ran.append(where)
        assert len(ran) >= 26
        # The README's submission really produced a run that completes.
        runs = world.api.get("/runs", params={"workflow": "orders", "limit": 200}).json()
        keys = {r["idempotency_key"]: r for r in runs["items"]}
        assert {"order-1001", "order-ORD-1001"} <= set(keys), sorted(k for k in keys if k)
        for key in ("order-1001", "order-ORD-1001"):
            world.reach(str(keys[key]["run_id"]), "completed")
        assert json.dumps(keys["order-1001"]["input"]).count("MUG-01") == 1
