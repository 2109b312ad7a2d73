"""Compensation (DESIGN §1): reverse order, partial failure, cancel → compensate → cancelled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select

from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import dead_letters, steps
from app.engine import control
from app.engine.registry import Registry
from app.sdk import Permanent, WorkflowContext, workflow
from tests.conftest import make_settings
from tests.integration import support

TENANT = "saga"
undone: list[str] = []


class Trip(BaseModel):
    key: str
    fail_undo: str = ""


def reserve(what: str) -> str:
    return f"{what}-booking"


def undo(booking: str) -> None:
    if booking.startswith("FAIL:"):
        raise RuntimeError(f"cannot undo {booking}")
    undone.append(booking)


def charge() -> None:
    raise Permanent(ValueError("card declined"))


@workflow("saga-fail")
async def saga_fail(ctx: WorkflowContext, trip: Trip) -> None:
    await ctx.step(reserve, "flight", name="flight", compensate=undo)
    hotel = "FAIL:hotel" if trip.fail_undo == "hotel" else "hotel"
    await ctx.step(reserve, hotel, name="hotel", compensate=undo)
    await ctx.step(reserve, "car", name="car", compensate=undo)
    await ctx.step(charge)


@workflow("saga-cancel")
async def saga_cancel(ctx: WorkflowContext, trip: Trip) -> None:
    await ctx.step(reserve, "flight", name="flight", compensate=undo)
    await ctx.step(reserve, "hotel", name="hotel", compensate=undo)
    await ctx.signal("confirm")  # waits until cancelled
    await ctx.step(reserve, "car", name="car", compensate=undo)


REGISTRY = Registry([saga_fail, saga_cancel])


@pytest.fixture
def csettings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, tmp_path)


def worker(settings: Settings, db: Database) -> Any:
    return support.workers(settings, db, REGISTRY, concurrency=4)


async def submit(db: Database, settings: Settings, name: str, **inp: Any) -> Any:
    return await support.submit(db, settings, REGISTRY, TENANT, name, **inp)


async def reach(db: Database, run_id: Any, *statuses: str) -> Any:
    return await support.reach(db, TENANT, run_id, *statuses)


async def step_statuses(db: Database, run_id: Any) -> dict[str, str]:
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(steps.c.step_id, steps.c.status).where(steps.c.run_id == run_id)
            )
        ).all()
    return {r[0]: r[1] for r in rows}


async def test_failure_compensates_in_reverse_order(csettings: Settings, db: Database) -> None:
    undone.clear()
    run_id = await submit(db, csettings, "saga-fail", key="a")
    async with worker(csettings, db):
        row = await reach(db, run_id, "compensated", "failed")
    assert (row["status"], row["reason"]) == ("compensated", "failure_non_retryable")
    assert undone == ["car-booking", "hotel-booking", "flight-booking"]
    statuses = await step_statuses(db, run_id)
    assert statuses["flight"] == statuses["hotel"] == statuses["car"] == "compensated"
    assert statuses["car__compensate"] == "succeeded"
    async with db.read() as conn:
        assert (await conn.execute(select(dead_letters))).first() is None


async def test_failing_compensation_does_not_stop_the_others(
    csettings: Settings, db: Database
) -> None:
    undone.clear()
    run_id = await submit(db, csettings, "saga-fail", key="b", fail_undo="hotel")
    async with worker(csettings, db):
        row = await reach(db, run_id, "compensated", "failed")
    assert row["status"] == "failed"
    assert "hotel" in row["error"] and "compensation_failures" in row["error"]
    assert undone == ["car-booking", "flight-booking"]
    statuses = await step_statuses(db, run_id)
    assert statuses["hotel"] == "compensation_failed"
    assert statuses["hotel__compensate"] == "failed"


async def test_cancel_compensates_then_cancelled(csettings: Settings, db: Database) -> None:
    undone.clear()
    run_id = await submit(db, csettings, "saga-cancel", key="c")
    async with worker(csettings, db):
        await reach(db, run_id, "waiting_signal")
        row = await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="x")
        assert row["status"] in {"cancelling", "running", "cancelled"}
        # Cancelling again while compensation is under way changes nothing.
        await control.cancel(db, tenant_id=TENANT, run_id=run_id, actor="op", reason="again")
        row = await reach(db, run_id, "cancelled", "failed")
    assert (row["status"], row["reason"]) == ("cancelled", "canceled_by_request")
    assert undone == ["hotel-booking", "flight-booking"]
    statuses = await step_statuses(db, run_id)
    assert "car" not in statuses  # cancel never advances the workflow
    assert statuses["flight"] == "compensated"
