"""The TypeScript route (docs/clients.md): openapi-typescript + openapi-fetch from npm.

The committed package (``clients/typescript``: package.json, package-lock.json,
tsconfig.json, src/) is installed with ``npm ci`` into a temp dir; the types are generated
from the committed spec with the documented flags (``npm run generate``), ``tsc --strict``
compiles the client, and Node submits runs to a live server and awaits them. The same
install lints the committed spec with Redocly's recommended rules. Skips only when
``node`` is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.conftest import ROOT, Stack, token

PACKAGE = ROOT / "clients" / "typescript"
SPEC = ROOT / "openapi" / "openapi.json"

pytestmark = [
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.timeout(900),  # npm ci, type generation and tsc on a loaded machine
    # One worker runs npm ci once for the whole module (ADR 0019).
    pytest.mark.xdist_group("typescript"),
]


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def ts_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The committed package, installed (npm ci), generated and compiled in a temp dir."""
    npm = shutil.which("npm")
    assert npm, "node is installed but npm is not"
    base = tmp_path_factory.mktemp("ts")
    work = base / "clients" / "typescript"
    work.mkdir(parents=True)
    for name in ("package.json", "package-lock.json", "tsconfig.json"):
        shutil.copy(PACKAGE / name, work / name)
    (work / "src").mkdir()
    for source in (PACKAGE / "src").glob("*.ts"):
        if source.name != "schema.d.ts":  # generated below, from the committed spec
            shutil.copy(source, work / "src" / source.name)
    # The package's scripts name the spec as ../../openapi/openapi.json, as in the repo.
    (base / "openapi").mkdir()
    shutil.copy(SPEC, base / "openapi" / "openapi.json")
    _run([npm, "ci", "--no-audit", "--no-fund"], work)
    _run([npm, "run", "generate"], work)
    _run([npm, "exec", "--", "tsc", "--strict", "-p", "."], work)
    yield work


def test_committed_spec_is_clean_under_redocly(ts_project: Path) -> None:
    out = subprocess.run(
        ["npx", "redocly", "lint", str(SPEC), "--format=json"],
        cwd=ts_project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(out.stdout)
    problems = [
        f"{p['ruleId']}: {p['message']} at {p['location'][0]['pointer']}"
        for p in report["problems"]
    ]
    assert report["totals"] == {"errors": 0, "warnings": 0, "ignored": 0}, problems
    assert out.returncode == 0


def test_types_compile_strict_and_check_the_api(ts_project: Path) -> None:
    # The compiler really checks calls against the spec: a wrong body does not compile.
    bad = ts_project / "src" / "bad.ts"
    bad.write_text(
        'import { treadleClient } from "./treadle.js";\n'
        'const c = treadleClient("http://x", "t");\n'
        'await c.POST("/runs", { body: { workflow: 1 } });\n'
    )
    try:
        done = subprocess.run(
            ["npx", "tsc", "--strict", "--noEmit", "-p", "."],
            cwd=ts_project,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        bad.unlink()
    assert done.returncode != 0
    assert "src/bad.ts(3," in done.stdout and "TS2322" in done.stdout, done.stdout


def _node(ts_project: Path, stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**stack.env, "TREADLE_URL": stack.url, "TREADLE_TOKEN": token()}
    return subprocess.run(
        ["node", "dist/example.js", *args],
        cwd=ts_project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_node_submits_and_awaits_runs(stack: Stack, ts_project: Path) -> None:
    stack.start_worker()
    value = {"greeting": "héllo", "n": [1, 2, 3]}
    done = _node(ts_project, stack, "acc-echo", json.dumps({"value": value}))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    result = answer["result"]
    assert (result["done"], result["status"], result["reason"]) == (True, "completed", "succeeded")
    assert result["output"] == value
    # The text report through its own operation, and a problem's code from a quoted id.
    assert "acc-echo" in answer["report"] and answer["reportLines"] > 4
    assert answer["missing"] == "run_not_found"

    failed = _node(ts_project, stack, "acc-fail", json.dumps({"name": "ts"}))
    assert failed.returncode == 1, failed.stderr
    result = json.loads(failed.stdout)["result"]
    assert (result["status"], result["reason"]) == ("failed", "failure_non_retryable")
