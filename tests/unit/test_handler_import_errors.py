"""Every way a ``--handlers`` module can fail to load is one line naming it, no traceback.

In-process (typer's runner) for every command that loads handlers; the same refusal from
the installed wheel in real processes is in tests/packaging/test_their_project.py.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from app.core.errors import HandlersNotLoaded
from app.engine.registry import Registry, import_handler_module

COMMANDS = [["worker"], ["worker", "--check"], ["dev", "--port", "1"]]


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh package name in the working directory (the CLI puts that on sys.path)."""
    name = f"team_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "broken.py").write_text("import json\n\nraise ImportError('billing SDK missing')\n")
    (root / "crashes.py").write_text("X = 1\nY = X / 0\n")
    (root / "needs_lib.py").write_text("import nosuchlib_for_treadle\n")
    (root / "syntax.py").write_text("def f(:\n")
    (root / "empty.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setenv("TREADLE_DATA_DIR", str(tmp_path / ".treadle"))
    monkeypatch.delenv("TREADLE_DATABASE_URL", raising=False)
    monkeypatch.delenv("TREADLE_AUTH_MODE", raising=False)
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def cases(pkg: str) -> dict[str, list[str]]:
    """Module -> fragments its one-line refusal must contain."""
    return {
        "nosuch.mod": ["'nosuch.mod' not found", "no module named 'nosuch'"],
        f"{pkg}.nosuch": [f"'{pkg}.nosuch' not found", f"no module named '{pkg}.nosuch'"],
        f"{pkg}.broken": [f"'{pkg}.broken'", "ImportError: billing SDK missing", "broken.py:3"],
        f"{pkg}.crashes": [f"'{pkg}.crashes'", "ZeroDivisionError", "crashes.py:2"],
        f"{pkg}.needs_lib": [f"'{pkg}.needs_lib'", "nosuchlib_for_treadle", "needs_lib.py:1"],
        f"{pkg}.syntax": [f"'{pkg}.syntax'", "syntax.py", "line 1"],
        f"{pkg}.empty": [
            f"'{pkg}.empty' registers no workflows",
            "pass the module that defines your @workflow handlers",
        ],
        # Treadle's own modules import fine but hold no handlers: said so, and what to pass.
        "app.sdk": [
            "'app.sdk' registers no workflows",
            "part of Treadle itself",
            "pass the module that defines your @workflow handlers",
        ],
        "app.sdk.testing": ["'app.sdk.testing' registers no workflows", "part of Treadle"],
        "app.flows": ["'app.flows' not found", "Treadle's own package", "another name"],
    }


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_every_failure_is_one_line_naming_the_module(command: list[str], pkg: str) -> None:
    for module, fragments in cases(pkg).items():
        done = CliRunner().invoke(app, [*command, "--handlers", module])
        # stdout may hold the "starting worker" progress line; the refusal is stderr's one line.
        lines = done.stderr.strip().splitlines()
        assert done.exit_code == (1 if "--check" in command else 2), done.output
        assert len(lines) == 1 and "Traceback" not in done.output, done.output
        for fragment in fragments:
            assert fragment in lines[0], lines[0]


def test_the_registry_raises_a_domain_error_carrying_the_module(pkg: str) -> None:
    with pytest.raises(HandlersNotLoaded) as caught:
        Registry.from_modules(["examples.orders", f"{pkg}.broken"])
    assert caught.value.code == "handlers_not_loaded"
    assert caught.value.data == {"module": f"{pkg}.broken"}
    assert import_handler_module("examples.orders").__name__ == "examples.orders"
