"""The errors the test kit's actions raise are importable from ``app.sdk.testing``.

docs/authoring.md ("Testing workflows") shows the import block; this runs it as written,
and checks the class: every Treadle error a ``WorkflowTestEnv`` method names under
``Raises:`` is exported, so a test catching one never needs ``app.core``.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import app.core.errors as core_errors
import app.sdk.testing as kit
from app.sdk.testing import WorkflowTestEnv

DOC = Path(__file__).parents[2] / "docs" / "authoring.md"


def _documented_import() -> str:
    found = re.search(
        r"```python\n(from app\.sdk\.testing import \(\n.*?\n\))\n```", DOC.read_text(), re.S
    )
    assert found, "docs/authoring.md shows no `from app.sdk.testing import (...)` block"
    return found.group(1)


def test_the_documented_import_works_and_gives_the_core_classes() -> None:
    block = _documented_import()
    names: dict[str, object] = {}
    exec(block, names)  # the snippet exactly as a reader copies it
    imported = [n for n in re.findall(r"^\s+(\w+),", block, re.M)]
    assert "Forbidden" in imported, block
    for name in imported:
        assert names[name] is getattr(core_errors, name), name
        assert name in kit.__all__, name


def test_every_error_an_action_raises_is_exported_and_documented() -> None:
    raised: set[str] = set()
    for _, method in inspect.getmembers(WorkflowTestEnv, inspect.isfunction):
        doc = inspect.getdoc(method) or ""
        section = doc.partition("Raises:")[2]
        raised |= set(re.findall(r"^\s{4}(\w+):", section, re.M))
    errors = {n for n in raised if isinstance(getattr(core_errors, n, None), type)}
    assert {"Forbidden", "InvalidState", "StepNotFound"} <= errors, raised
    documented = set(re.findall(r"^\s+(\w+),", _documented_import(), re.M))
    for name in errors:
        assert getattr(kit, name, None) is getattr(core_errors, name), name
        assert name in documented, name
