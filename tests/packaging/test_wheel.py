"""The wheel and the sdist: what they carry and what they declare."""

from __future__ import annotations

import email
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.packaging.conftest import ROOT, Installed

# One worker builds and installs the wheel once for both modules (ADR 0019).
pytestmark = pytest.mark.xdist_group("packaging")


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


# Run by the installed venv's interpreter, outside the checkout: the pages and their assets
# come from what `pip install treadle` brought, not from this repository.
_DOCS_PROBE = """
import asyncio, httpx
from app.api.app import create_app
from app.core.settings import Settings

app = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:", dev_secret="x" * 32),
                 check_schema_on_start=False)
async def main():
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        for url in ["/docs", "/redoc", "/docs-assets/swagger-ui-bundle.js",
                    "/docs-assets/swagger-ui.css", "/docs-assets/redoc.standalone.js"]:
            r = await c.get(url)
            print(url, r.status_code, len(r.content))
asyncio.run(main())
"""


def test_the_installed_wheel_serves_docs_from_packaged_assets(installed: Installed) -> None:
    """``/docs`` and ``/redoc`` need no CDN: their bundles come with the install."""
    with zipfile.ZipFile(installed.wheel) as whl:
        meta = email.message_from_bytes(whl.read("treadle-0.1.0.dist-info/METADATA"))
        assert "app/api/docs_pages.py" in whl.namelist()
    requires = meta.get_all("Requires-Dist") or []
    assert any(r.startswith("fastapi-offline") and "extra" not in r for r in requires), requires
    done = subprocess.run(
        [str(installed.bin / "python"), "-c", _DOCS_PROBE],
        cwd=installed.venv,
        env=installed.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # Only the probe's own lines: logging is not configured in the probe, so structlog's
    # default prints the API's access-log lines to stdout beside them.
    probed = [line for line in done.stdout.splitlines() if line.startswith("/")]
    served = {line.split()[0]: line.split()[1:] for line in probed}
    assert len(served) == 5, done.stdout
    for url, (status, size) in served.items():
        assert status == "200", (url, status)
        # The bundles are hundreds of kB; a near-empty body would be a broken install.
        assert int(size) > (500 if url in {"/docs", "/redoc"} else 50_000), (url, size)
