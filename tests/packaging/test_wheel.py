"""The wheel and the sdist: what they carry and what they declare."""

from __future__ import annotations

import email
import tarfile
import zipfile
from pathlib import Path

from tests.packaging.conftest import ROOT, Installed


def _migrations() -> set[str]:
    return {p.name for p in (ROOT / "alembic" / "versions").glob("*.py")}


def test_the_wheel_carries_every_migration_inside_the_package(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert {"app/_alembic/env.py", "app/_alembic/alembic.ini", "app/py.typed"} <= names
    shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith("app/_alembic/versions/")}
    assert shipped == _migrations()
    # Only Treadle's own package: no repository folders as top-level packages.
    assert {n.split("/", 1)[0] for n in names} == {"app", "treadle-0.1.0.dist-info"}
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_declares_ranges_and_a_postgres_extra(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        meta = email.message_from_bytes(whl.read("treadle-0.1.0.dist-info/METADATA"))
    requires = meta.get_all("Requires-Dist") or []
    assert requires, "no dependencies declared"
    pinned = [r for r in requires if "==" in r.split(";", 1)[0]]
    assert not pinned, f"exact pins belong in uv.lock only: {pinned}"
    assert "postgres" in (meta.get_all("Provides-Extra") or [])
    asyncpg = [r for r in requires if r.startswith("asyncpg")]
    assert asyncpg and all("extra == 'postgres'" in r for r in asyncpg)
    assert any(r.startswith("aiosqlite") and "extra" not in r for r in requires)


def test_the_sdist_builds_the_same_wheel(installed: Installed) -> None:
    """``uv build`` made the wheel from the sdist: the sdist holds the migrations too."""
    with tarfile.open(installed.sdist) as sdist:
        names = {Path(n).relative_to("treadle-0.1.0").as_posix() for n in sdist.getnames()}
    assert {"alembic.ini", "alembic/env.py", "pyproject.toml", "app/py.typed"} <= names
    assert {f"alembic/versions/{m}" for m in _migrations()} <= names
    assert not [n for n in names if n.startswith(("tests/", "examples/", "benchmarks/", ".venv/"))]
