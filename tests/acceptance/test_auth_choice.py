"""Dev auth is never a silent default outside the embedded SQLite database.

``treadle serve`` on PostgreSQL without ``TREADLE_AUTH_MODE`` refuses to start with a
message naming the variable and the production choice (jwt), never the password; with
``TREADLE_AUTH_MODE=dev`` set explicitly it starts (with a warning). On SQLite, the
embedded default, it starts without being told. The README's production-style commands
name an auth mode.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import ROOT, Stack, free_port, token

pytestmark = pytest.mark.timeout(300)  # API and worker processes on a loaded machine


def _env_without_auth_mode(stack_env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in stack_env.items() if k != "TREADLE_AUTH_MODE"}


def test_serve_needs_an_auth_mode_outside_sqlite(
    database_url: str, stack_env: dict[str, str], tmp_path: Path
) -> None:
    env = _env_without_auth_mode(stack_env)
    if database_url.startswith("sqlite"):
        stack = Stack(database_url=database_url, tmp=tmp_path, env=env)
        try:
            stack.start_api()
            with stack.client(token()) as c:
                assert c.get("/runs").status_code == 200
        finally:
            stack.stop()
        return
    with_password = database_url.replace("postgres@", "postgres:hunter2@", 1)
    done = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "serve", "--port", str(free_port())],
        cwd=ROOT,
        env={**env, "TREADLE_DATABASE_URL": with_password},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refusing `treadle serve`" in done.stderr
    assert "TREADLE_AUTH_MODE" in done.stderr and "jwt" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout


def test_explicit_dev_mode_on_postgresql_starts_with_a_warning(
    database_url: str, stack_env: dict[str, str], tmp_path: Path
) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("the warning is for databases other than the embedded SQLite one")
    stack = Stack(database_url=database_url, tmp=tmp_path, env=stack_env)
    try:
        stack.start_api()
        assert httpx.get(stack.url + "/readyz", timeout=5).status_code == 200
    finally:
        stack.stop()
    warned = [
        line
        for line in stack.logs[-1].read_text().splitlines()
        if "dev-mode tokens outside the embedded database" in line
    ]
    assert len(warned) == 1
    assert json.loads(warned[0])["level"] == "warning"


def test_the_production_section_chooses_an_auth_mode() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Production-style deployment", 1)[1].split("\n## ", 1)[0]
    commands = "\n".join(re.findall(r"^```sh\n(.*?)^```", section, re.MULTILINE | re.DOTALL))
    assert "treadle serve" in commands
    assert "TREADLE_AUTH_MODE=jwt" in commands
    assert "TREADLE_DEV_SECRET" not in commands
