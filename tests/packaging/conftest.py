"""The built wheel in a venv of its own, outside the checkout (a team's own repository).

Once per session: ``uv build`` (the sdist, then the wheel *from the sdist*, as an index
would build it), a fresh ``uv venv`` in a temporary directory, and ``uv pip install`` of
the wheel with the PostgreSQL extra plus the team's test tools. Versions are constrained
to ``uv.lock`` so the install comes from the uv cache that ``uv sync`` filled (it tries
``--offline`` first and falls back to the index only when the cache lacks something).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import _pg_admin, pg_url
from tests.packaging.project import write_project

ROOT = Path(__file__).resolve().parents[2]
# What a team puts next to Treadle in its own dev environment.
TEAM_TOOLS = ["pytest", "pytest-asyncio", "mypy"]


@dataclass(frozen=True)
class Installed:
    """The built artifacts and the venv they were installed into."""

    wheel: Path
    sdist: Path
    venv: Path
    seconds: dict[str, float]

    @property
    def bin(self) -> Path:
        """The venv's scripts directory (``treadle``, ``pytest``, ``mypy``)."""
        return self.venv / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment for the venv's tools: no checkout on the path, no TREADLE_*."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TREADLE_", "PYTHON", "VIRTUAL_ENV", "UV_"))
        }
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        env.update(extra)
        return env


def _uv(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["uv", *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"uv {' '.join(args)}:\n{done.stderr}{done.stdout}"
    return done


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel once, install it into a fresh venv outside the checkout."""
    if shutil.which("uv") is None:
        pytest.fail("uv is not on PATH (scripts/bootstrap installs it)")
    base = tmp_path_factory.mktemp("packaging")
    assert not base.resolve().is_relative_to(ROOT), "the venv must live outside the checkout"
    seconds: dict[str, float] = {}

    started = time.monotonic()
    _uv("build", "--quiet", "--out-dir", str(base / "dist"))
    seconds["build"] = time.monotonic() - started
    (wheel,) = (base / "dist").glob("treadle-*.whl")
    (sdist,) = (base / "dist").glob("treadle-*.tar.gz")

    started = time.monotonic()
    constraints = base / "constraints.txt"
    _uv(
        "export", "--frozen", "--all-extras", "--no-emit-project", "--no-hashes",
        "--quiet", "-o", str(constraints),
    )  # fmt: skip
    venv = base / "venv"
    _uv("venv", "--quiet", "--python", os.path.realpath(sys.executable), str(venv))
    install = [
        "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
        "-c", str(constraints), f"treadle[postgres] @ {wheel.as_uri()}", *TEAM_TOOLS,
    ]  # fmt: skip
    _install(install, cwd=base)
    seconds["install"] = time.monotonic() - started
    return Installed(wheel=wheel, sdist=sdist, venv=venv, seconds=seconds)


def _install(args: list[str], cwd: Path) -> None:
    # Outside the checkout (cwd), so this repository's [tool.uv] settings do not apply.
    offline = subprocess.run(
        ["uv", *args, "--offline"], cwd=cwd, capture_output=True, text=True, check=False
    )
    if offline.returncode != 0:  # a cold uv cache: the same install from the index
        _uv(*args, cwd=cwd)


@pytest.fixture(scope="session")
def plain(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The same wheel without extras (``pip install treadle``): no PostgreSQL driver."""
    base = tmp_path_factory.mktemp("plain")
    constraints = installed.wheel.parent.parent / "constraints.txt"
    _uv("venv", "--quiet", "--python", os.path.realpath(sys.executable), str(base / "venv"))
    _install(
        ["pip", "install", "--quiet", "--python", str(base / "venv" / "bin" / "python"),
         "-c", str(constraints), f"treadle @ {installed.wheel.as_uri()}"],
        cwd=base,
    )  # fmt: skip
    return Installed(installed.wheel, installed.sdist, base / "venv", {})


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The team's handler repository, written in this test's temporary directory."""
    return write_project(tmp_path / "theirproject")


@pytest.fixture
def empty_pg_database() -> Iterator[str]:
    """A new, empty PostgreSQL database (not the migrated template): ``migrate`` fills it."""
    name = f"pkg_{uuid.uuid4().hex[:12]}"
    asyncio.run(_pg_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield pg_url(name)
    finally:
        asyncio.run(_pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
