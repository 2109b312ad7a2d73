"""A run's and a step's error show the user's frames only (docs/adr/0025-user-frames-only.md).

Real workers on both databases: a step failing inside nested helpers, a cause chain, a
synchronous step (run in a thread), a transactional step, and the same run with
``TREADLE_ERROR_TRACEBACKS=full``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.settings import TracebackMode
from app.db.database import Database
from app.db.tables import steps
from app.engine.registry import Registry
from app.sdk import RetryPolicy, WorkflowContext, workflow
from tests.conftest import make_settings
from tests.integration import support

TENANT = "tracebacks"
HERE = "tests/integration/test_error_tracebacks.py"


class Order(BaseModel):
    order_id: str


def read_order_file(order_id: str) -> None:
    # The message names an absolute path of the user's own: it is kept as it is.
    raise FileNotFoundError(f"no such file: /srv/orders/{order_id}.json")


def load_order(order_id: str) -> None:
    read_order_file(order_id)


async def charge(order_id: str) -> None:
    """Fails two helpers deep; the cause chain adds a second exception."""
    try:
        load_order(order_id)
    except FileNotFoundError as exc:
        raise RuntimeError(f"order {order_id} cannot be charged") from exc


def charge_sync(order_id: str) -> None:
    """A synchronous step: the engine runs it in a thread (``asyncio.to_thread``)."""
    load_order(order_id)


async def insert_row(tx: AsyncSession, order_id: str) -> None:
    """A transactional step failing in its own code (after a statement ran)."""
    await tx.execute(text("SELECT 1"))
    load_order(order_id)


@workflow("tb-nested")
async def nested_flow(ctx: WorkflowContext, order: Order) -> None:
    await ctx.step(charge, order.order_id, retry=RetryPolicy(max_attempts=1))


@workflow("tb-sync")
async def sync_flow(ctx: WorkflowContext, order: Order) -> None:
    await ctx.step(charge_sync, order.order_id, retry=RetryPolicy(max_attempts=1))


@workflow("tb-transactional")
async def transactional_flow(ctx: WorkflowContext, order: Order) -> None:
    await ctx.transaction(insert_row, order.order_id, retry=RetryPolicy(max_attempts=1))


@workflow("tb-body")
async def body_flow(ctx: WorkflowContext, order: Order) -> None:
    # A bug in the workflow itself, not in a step.
    load_order(order.order_id)


REGISTRY = Registry([nested_flow, sync_flow, transactional_flow, body_flow])

FRAME = re.compile(r'^  File "([^"]*)", line \d+, in (\S+)$', re.MULTILINE)


def frames(traceback: str) -> list[tuple[str, str]]:
    """The ``(file, function)`` of every frame line of a formatted traceback."""
    return FRAME.findall(traceback)


async def fail_run(
    database_url: str, tmp_path: Path, workflow_name: str, **overrides: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``workflow_name`` to failure; returns the run's error and its steps' errors."""
    settings = make_settings(database_url, tmp_path, **overrides)
    db = Database(settings)
    try:
        run_id = await support.submit(
            db, settings, REGISTRY, TENANT, workflow_name, order_id="A-17"
        )
        async with support.workers(settings, db, REGISTRY):
            row = await support.reach(db, TENANT, run_id, "completed", "failed")
        async with db.read() as conn:
            step_errors = (
                (await conn.execute(select(steps.c.error).where(steps.c.run_id == run_id)))
                .scalars()
                .all()
            )
    finally:
        await db.dispose()
    assert row["status"] == "failed", row
    return json.loads(row["error"]), [json.loads(e) for e in step_errors if e is not None]


def assert_user_only(traceback: str) -> None:
    """No absolute path, no frame of Treadle's package or of the standard library."""
    assert "/work/" not in traceback and str(Path.cwd()) not in traceback, traceback
    for file, _ in frames(traceback):
        assert not file.startswith("/"), traceback
        assert not file.startswith("app/"), traceback
        assert "asyncio" not in file and "concurrent" not in file, traceback
    assert "app/engine" not in traceback, traceback


@pytest.mark.parametrize("workflow_name", ["tb-nested", "tb-sync", "tb-transactional"])
async def test_a_failing_step_shows_only_its_own_frames(
    database_url: str, tmp_path: Path, workflow_name: str
) -> None:
    """Nested helpers, relative paths, the user's message untouched; the run's error too."""
    run_error, (step_error,) = await fail_run(database_url, tmp_path, workflow_name)
    shown = frames(step_error["traceback"])
    step_fn = {"tb-nested": "charge", "tb-sync": "charge_sync"}.get(workflow_name, "insert_row")
    # Outermost first, exactly the user's call path: step, helper, helper.
    assert shown[:3] == [(HERE, step_fn), (HERE, "load_order"), (HERE, "read_order_file")], (
        step_error["traceback"]
    )
    assert_user_only(step_error["traceback"])
    assert "FileNotFoundError: no such file: /srv/orders/A-17.json" in step_error["traceback"]
    if workflow_name == "tb-nested":
        # The cause chain: both exceptions, each with its own user frames.
        assert "The above exception was the direct cause" in step_error["traceback"]
        assert shown[3:] == [(HERE, "charge")], step_error["traceback"]
        assert step_error["type"] == "RuntimeError"
        assert step_error["message"] == "order A-17 cannot be charged"
    else:
        assert step_error["message"] == "no such file: /srv/orders/A-17.json"
    # The run's error: where the workflow awaited the step, and the step's chain before it.
    assert run_error["type"] == "StepFailed"
    assert_user_only(run_error["traceback"])
    assert frames(run_error["traceback"])[-1][1].endswith("_flow"), run_error["traceback"]


async def test_an_error_of_the_workflow_body_shows_its_frames(
    database_url: str, tmp_path: Path
) -> None:
    """An exception escaping the workflow body: the body's frame and its helpers only."""
    run_error, _ = await fail_run(database_url, tmp_path, "tb-body")
    assert frames(run_error["traceback"]) == [
        (HERE, "body_flow"),
        (HERE, "load_order"),
        (HERE, "read_order_file"),
    ], run_error["traceback"]
    assert (run_error["type"], run_error["message"]) == (
        "FileNotFoundError",
        "no such file: /srv/orders/A-17.json",
    )


async def test_full_tracebacks_show_every_frame(database_url: str, tmp_path: Path) -> None:
    """``TREADLE_ERROR_TRACEBACKS=full``: Treadle's frames and absolute paths come back."""
    run_error, (step_error,) = await fail_run(
        database_url, tmp_path, "tb-nested", error_tracebacks=TracebackMode.FULL
    )
    for traceback in (step_error["traceback"], run_error["traceback"]):
        files = [file for file, _ in frames(traceback)]
        assert str(Path.cwd() / HERE) in files, traceback
        assert any(f.endswith("app/engine/executor.py") and f.startswith("/") for f in files)
    assert "The above exception was the direct cause" in step_error["traceback"]


def test_the_setting_refuses_unknown_values(tmp_path: Path) -> None:
    """A typo in ``TREADLE_ERROR_TRACEBACKS`` is a clear validation error, not a default."""
    with pytest.raises(ValueError, match="error_tracebacks"):
        make_settings(f"sqlite+aiosqlite:///{tmp_path}/x.db", tmp_path, error_tracebacks="all")
