"""A team's own repository on the installed wheel, end to end (docs/your-project.md).

Everything runs in the venv of ``conftest.installed`` with the team's repository as the
working directory: nothing from this checkout is importable there.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.helpers import wait_for_sync, wait_until_serving
from tests.packaging.conftest import ROOT, Installed
from tests.packaging.project import APP_FLOWS

# One worker builds and installs the wheel once for both modules (ADR 0019).
pytestmark = pytest.mark.xdist_group("packaging")

AUTH = "Authorization"
INVOICE = {"customer": "acme", "amounts_cents": [1200, 34]}


def run(
    installed: Installed,
    cwd: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run a tool of the venv (``treadle``, ``pytest``, ``mypy``) in ``cwd``."""
    return subprocess.run(
        [str(installed.bin / args[0]), *args[1:]],
        cwd=cwd,
        env=env or installed.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(
    installed: Installed, cwd: Path, env: dict[str, str], *args: str
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """Start ``treadle <args>`` in ``cwd``; yield it and its log; SIGTERM it at the end."""
    log = cwd / f"{args[0]}-{len(list(cwd.glob('*.log')))}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(installed.bin / "treadle"), *args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        yield proc, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def complete_invoice(url: str, token: str) -> None:
    """Submit an ``invoice`` run over HTTP and wait for its typed output."""
    with httpx.Client(base_url=url, headers={AUTH: f"Bearer {token}"}, timeout=60) as c:
        created = c.post("/runs", json={"workflow": "invoice", "input": INVOICE})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]

        def finished() -> dict[str, object] | None:
            r = c.get(f"/runs/{run_id}/result", params={"wait": 10})
            return r.json() if r.status_code == 200 else None

        result = wait_for_sync(finished, timeout=60, what="invoice run finished")
    assert result["status"] == "completed", result
    assert result["output"] == {"customer": "acme", "total_cents": 1234, "sent": True}


def test_their_unit_tests_pass_with_the_test_kit(installed: Installed, project: Path) -> None:
    tests = run(installed, project, "pytest", "-q", "-p", "no:cacheprovider", "tests")
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "1 passed" in tests.stdout
    # The venv really is on the wheel, not on this checkout.
    where = run(installed, project, "python", "-c", "import app; print(app.__file__)")
    assert where.returncode == 0, where.stderr
    located = Path(where.stdout.strip()).resolve()
    assert located.is_relative_to(installed.venv.resolve()) and not located.is_relative_to(ROOT)


# mypy --strict follows app.sdk (py.typed) into Treadle and its dependencies with a cold
# cache: the slowest step of this directory (about a minute on an idle 2-core machine).
@pytest.mark.timeout(600)
def test_their_handlers_and_tests_are_mypy_strict_clean(
    installed: Installed, project: Path
) -> None:
    typed = run(installed, project, "mypy", "--strict", "theirpkg", "tests", timeout=580)
    assert typed.returncode == 0, typed.stdout + typed.stderr
    assert "Success: no issues found in 5 source files" in typed.stdout
    # Without py.typed the same run reports app.sdk as untyped: the marker is what counts.
    assert "import-untyped" not in typed.stdout


def test_migrate_serve_and_a_worker_on_postgresql(
    installed: Installed, project: Path, empty_pg_database: str
) -> None:
    # Dev tokens on PostgreSQL only when asked for by name (docs/security.md).
    env = installed.env(TREADLE_DATABASE_URL=empty_pg_database, TREADLE_AUTH_MODE="dev")
    before = run(installed, project, "treadle", "worker", "--check", "--handlers",
                 "theirpkg.flows", env=env)  # fmt: skip
    assert before.returncode == 1 and "treadle migrate" in before.stderr, before.stderr

    migrated = run(installed, project, "treadle", "migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert re.fullmatch(r"database at revision \d{4}\n", migrated.stdout), migrated.stdout

    check = run(installed, project, "treadle", "worker", "--check", "--handlers",
                "theirpkg.flows", env=env)  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "ok database: reachable, schema at" in check.stdout

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        process(installed, project, env, "serve", "--port", str(port)) as (api, api_log),
        process(installed, project, env, "worker", "--handlers", "theirpkg.flows"),
    ):
        wait_until_serving(url, api, api_log)
        # `serve` created the dev secret in the project's .treadle/; `token` run there
        # signs with it, so the server accepts the token.
        minted = run(installed, project, "treadle", "token", env=env)
        assert minted.returncode == 0, minted.stderr
        complete_invoice(url, minted.stdout.strip().splitlines()[-1])


def test_dev_on_sqlite_and_token_from_elsewhere(
    installed: Installed, project: Path, tmp_path: Path
) -> None:
    env = installed.env()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with process(
        installed, project, env, "dev", "--port", str(port), "--handlers", "theirpkg.flows"
    ) as (dev, log):
        wait_until_serving(url, dev, log)
        assert (project / ".treadle" / "treadle.db").is_file()
        printed = re.search(r"^export TREADLE_TOKEN=(\S+)$", log.read_text(), re.M)
        assert printed, log.read_text()
        complete_invoice(url, printed.group(1))

        # Elsewhere, `treadle token` names the secret it did not find instead of
        # minting a token with a new secret that the server would reject.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        lost = run(installed, elsewhere, "treadle", "token", env=env)
        assert lost.returncode != 0 and not lost.stdout
        assert str(elsewhere / ".treadle" / "dev-secret") in lost.stderr
        assert not (elsewhere / ".treadle" / "dev-secret").exists()
        found = run(installed, elsewhere, "treadle", "token",
                    env={**env, "TREADLE_DATA_DIR": str(project / ".treadle")})  # fmt: skip
        assert found.returncode == 0, found.stderr
        complete_invoice(url, found.stdout.strip())


def _one_line_refusal(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_handler_import_errors_are_one_line_naming_the_module(
    installed: Installed, project: Path
) -> None:
    """A missing and a raising module, from the wheel, in real processes.

    tests/unit/test_handler_import_errors.py runs every kind of failure through every
    command in-process.
    """
    (project / "theirpkg" / "broken.py").write_text(
        "import json\n\nraise ImportError('the billing SDK is not configured')\n"
    )
    worker = run(installed, project, "treadle", "worker", "--handlers", "theirpkg.flows",
                 "--handlers", "nosuch.mod")  # fmt: skip
    _one_line_refusal(worker, "'nosuch.mod' not found", "no module named 'nosuch'")
    dev = run(installed, project, "treadle", "dev", "--port", str(free_port()),
              "--handlers", "theirpkg.broken")  # fmt: skip
    _one_line_refusal(dev, "'theirpkg.broken'", "ImportError: the billing SDK", "broken.py:3")
    assert not (project / ".treadle" / "treadle.db").exists(), "refused before migrating"
    # The examples are not in the wheel: `dev` without --handlers says what to pass.
    bare = run(installed, project, "treadle", "dev", "--port", str(free_port()))
    _one_line_refusal(bare, "examples are not installed", "--handlers yourpkg.flows")


def test_a_team_package_named_app_is_refused_with_the_reason(
    installed: Installed, tmp_path: Path
) -> None:
    """docs/adr/0015: ``app`` is Treadle's package; a team's ``app`` cannot sit beside it."""
    fastapi_style = tmp_path / "their-fastapi-project"
    (fastapi_style / "app").mkdir(parents=True)
    (fastapi_style / "app" / "__init__.py").write_text("")
    (fastapi_style / "app" / "flows.py").write_text(APP_FLOWS)
    done = run(installed, fastapi_style, "treadle", "worker", "--handlers", "app.flows")
    _one_line_refusal(done, "'app.flows'", "Treadle's own package", "another name")


def test_a_plain_install_runs_sqlite_and_names_the_postgres_extra(
    plain: Installed, project: Path
) -> None:
    """``pip install treadle`` (no extras): the embedded default works, PostgreSQL says why not."""
    has_driver = run(plain, project, "python", "-c", "import asyncpg")
    assert has_driver.returncode != 0, "the plain install should not have asyncpg"
    migrated = run(plain, project, "treadle", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    check = run(plain, project, "treadle", "worker", "--check", "--handlers", "theirpkg.flows")
    assert check.returncode == 0, check.stderr
    pg_env = plain.env(TREADLE_DATABASE_URL="postgresql+asyncpg://u@127.0.0.1/x")
    on_pg = run(plain, project, "treadle", "migrate", env=pg_env)
    assert on_pg.returncode == 2 and "Traceback" not in on_pg.stderr, on_pg.stderr
    assert "install treadle[postgres]" in on_pg.stderr
    # Asked to trace without the otel extra: one warning, and the process runs untraced.
    otel_env = plain.env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    code = "from app.core import tracing; print('traced', tracing.setup('their-worker'))"
    untraced = run(plain, project, "python", "-c", code, env=otel_env)
    assert untraced.returncode == 0, untraced.stderr
    assert "traced False" in untraced.stdout
    assert "treadle[otel] extra is not installed" in untraced.stdout + untraced.stderr
