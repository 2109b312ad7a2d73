"""``treadle worker --check``: the worker's health check, on both databases."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from app.db.migrations import head_revision


def check(database_url: str, *handlers: str) -> tuple[int, str]:
    args = ["worker", "--check"] + [a for h in handlers for a in ("--handlers", h)]
    done = CliRunner().invoke(app, args, env={"TREADLE_DATABASE_URL": database_url})
    return done.exit_code, done.output


def test_healthy_when_database_schema_and_handlers_are(database_url: str) -> None:
    code, out = check(database_url, "examples.orders", "examples.onboarding")
    assert code == 0, out
    assert "ok handlers: 2 workflow(s)" in out
    assert f"ok database: reachable, schema at {head_revision()}" in out


def test_handlers_from_the_environment(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREADLE_HANDLERS", "examples.orders examples.order_total")
    code, out = check(database_url)
    assert code == 0 and "2 workflow(s) from examples.orders, examples.order_total" in out, out


def test_unhealthy_schema_not_at_head(tmp_path: Path) -> None:
    code, out = check(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}", "examples.orders")
    assert code == 1 and "unhealthy schema:" in out and "treadle migrate" in out, out


def test_unhealthy_database_unreachable() -> None:
    code, out = check("postgresql+asyncpg://nobody@127.0.0.1:1/none", "examples.orders")
    assert code == 1 and "unhealthy database: unreachable" in out, out


def test_unhealthy_handlers_before_the_database_is_touched(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    code, out = check(f"sqlite+aiosqlite:///{db}", "examples.orders", "nosuch.mod")
    assert code == 1 and "unhealthy handlers: handler module 'nosuch.mod' not found" in out
    assert not db.exists()
