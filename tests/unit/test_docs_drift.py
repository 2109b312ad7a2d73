"""Facts the docs and the compose file repeat stay equal to the code they describe."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from app.cli.main import EXAMPLE_HANDLERS
from app.db.migrations import head_revision
from tests.packaging import project

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _mentions(pattern: str) -> list[tuple[str, str]]:
    """``(file, match)`` for every match of ``pattern`` in README.md and docs/."""
    return [
        (str(doc.relative_to(ROOT)), m.group(1))
        for doc in DOCS
        for m in re.finditer(pattern, doc.read_text())
    ]


def test_every_documented_migration_revision_is_the_head() -> None:
    shown = _mentions(r"database at revision (\w+)")
    assert shown, "no doc shows what `treadle migrate` prints"
    stale = [(doc, rev) for doc, rev in shown if rev != head_revision()]
    assert not stale, f"`treadle migrate` prints revision {head_revision()}; docs say {stale}"


def test_compose_workers_load_every_example_that_treadle_dev_loads() -> None:
    workers = {n: s for n, s in COMPOSE["services"].items() if "worker" in s.get("command", [])}
    assert workers
    for name, service in workers.items():
        handlers = service["environment"]["TREADLE_HANDLERS"].split()
        assert handlers == EXAMPLE_HANDLERS, name
        assert service["healthcheck"]["test"][-2:] == ["worker", "--check"], name


def test_docs_listing_what_treadle_dev_loads_list_all_of_it() -> None:
    rows = [
        (doc.name, line)
        for doc in DOCS
        for line in doc.read_text().splitlines()
        if "`treadle dev" in line and "examples." in line
    ]
    assert rows, "no doc lists the modules treadle dev loads"
    for doc, line in rows:
        missing = [m for m in EXAMPLE_HANDLERS if f"`{m}`" not in line]
        assert not missing, f"{doc}: the treadle dev line omits {missing}"


def test_every_example_module_the_docs_name_exists() -> None:
    named = _mentions(r"\bexamples\.([a-z_]+)\b") + [
        ("docker-compose.yml", m) for m in re.findall(r"\bexamples\.([a-z_]+)\b", str(COMPOSE))
    ]
    assert named
    missing = sorted(
        {(doc, m) for doc, m in named if not (ROOT / "examples" / f"{m}.py").is_file()}
    )
    assert not missing, f"docs name example modules that do not exist: {missing}"


def test_your_project_shows_the_files_the_packaging_tests_run() -> None:
    """docs/your-project.md's code blocks are the project tests/packaging builds."""
    doc = (ROOT / "docs" / "your-project.md").read_text()
    blocks = {
        m.group(1): m.group(2)
        for m in re.finditer(
            r"`([\w/]+\.(?:py|toml))`[^\n]*\n(?:[^\n`]*\n)*?```(?:python|toml)\n(.*?)```",
            doc,
            re.S,
        )
    }
    assert blocks == {
        "pyproject.toml": project.PYPROJECT,
        "theirpkg/models.py": project.MODELS,
        "theirpkg/flows.py": project.FLOWS,
        "tests/test_invoice.py": project.UNIT_TEST,
    }
