"""The test kit (app.sdk.testing) drives the real engine with a virtual clock.

SQLite only, by design: the virtual clock replaces SQLite's ``'now'`` on the kit's own
connections (see the module docstring of app.sdk.testing).
"""

from __future__ import annotations

import asyncio
import time
import typing
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from app.core.errors import Forbidden, InvalidInput
from app.core.status import RunStatus, StepStatus
from app.sdk import Permanent, RetryPolicy, WaitTimedOut, WorkflowContext, current_step, workflow
from app.sdk.testing import RunBlocked, RunNotCompleted, WorkflowTestEnv
from app.sdk.workflow import WorkflowDefinition

HOUR = 3600.0
DAY = 86_400.0


class Job(BaseModel):
    key: str
    seconds: float = HOUR


@workflow("kit-sleeper")
async def sleeper(ctx: WorkflowContext, job: Job) -> float:
    """Sleep ``job.seconds``; return the seconds that passed by journaled ctx.now()."""
    before = await ctx.now()
    await ctx.sleep(job.seconds)
    after = await ctx.now()
    return (after - before).total_seconds()


# Real time a test may spend between two virtual instants (a loaded 2-core machine).
SLACK = 5.0


@workflow("kit-approval")
async def needs_approval(ctx: WorkflowContext, job: Job) -> str:
    try:
        decision = await ctx.approval("boss", group="bosses", timeout=3 * DAY)
    except WaitTimedOut:
        return "timed out"
    return f"approved by {decision.decided_by[0]} with {decision.payload}"


@workflow("kit-signal")
async def waits_for_signal(ctx: WorkflowContext, job: Job) -> list[str]:
    first = await ctx.signal("go")
    try:
        second = await ctx.signal("go", timeout=job.seconds)
    except WaitTimedOut:
        second = "none"
    return [str(first), str(second)]


undone: list[str] = []


def book(what: str) -> str:
    return f"{what}-booking"


def unbook(booking: str) -> None:
    undone.append(booking)


@workflow("kit-saga")
async def saga(ctx: WorkflowContext, job: Job) -> None:
    await ctx.step(book, f"{job.key}-flight", name="flight", compensate=unbook)
    await ctx.step(book, f"{job.key}-hotel", name="hotel", compensate=unbook)
    await ctx.signal("confirm")


def flaky() -> int:
    attempt = current_step().attempt
    if attempt < 3:
        raise RuntimeError(f"attempt {attempt} fails")
    return attempt


@workflow("kit-retry")
async def retrying(ctx: WorkflowContext, job: Job) -> int:
    policy = RetryPolicy(max_attempts=5, backoff="fixed", delay=600, max_delay=600)
    result: int = await ctx.step(flaky, retry=policy)
    return result


def refuse() -> None:
    raise Permanent(ValueError("no"))


@workflow("kit-fail")
async def failing(ctx: WorkflowContext, job: Job) -> None:
    await ctx.step(refuse)


@workflow("kit-parent")
async def parent(ctx: WorkflowContext, job: Job) -> list[float]:
    # Two children in parallel, each sleeping: the parent waits for both.
    first, second = await asyncio.gather(
        ctx.child(sleeper, Job(key=f"{job.key}-1", seconds=DAY)),
        ctx.child(sleeper, Job(key=f"{job.key}-2", seconds=2 * DAY)),
    )
    return [first, second]


ALL: list[WorkflowDefinition[Any, Any]] = [
    parent,
    sleeper,
    needs_approval,
    waits_for_signal,
    saga,
    retrying,
    failing,
]


async def test_skip_fires_a_one_hour_timer_only_when_due() -> None:
    async with WorkflowTestEnv(ALL) as env:
        run = await env.start(sleeper, Job(key="a"))
        snap = await env.get(run)
        assert snap.status == RunStatus.WAITING_TIMER
        assert snap.waiting_deadline is not None
        assert timedelta(minutes=59) < snap.waiting_deadline - env.now() <= timedelta(hours=1)

        await env.skip(timedelta(minutes=59))
        assert (await env.get(run)).status == RunStatus.WAITING_TIMER

        await env.skip(timedelta(minutes=2))
        snap = await env.get(run)
        assert snap.status == RunStatus.COMPLETED
        # ctx.now() journaled virtual database time on both sides of the sleep.
        # ctx.now() journaled virtual time on both sides: the timer fired in the skip
        # that passed its deadline, 61 minutes after it started.
        assert 3660 <= snap.output < 3660 + SLACK
        timer = await env.step(run, "sleep")
        assert timer.kind == "timer" and timer.status == StepStatus.SUCCEEDED
        kinds = [e.kind for e in await env.events(run)]
        assert "timer_fired" in kinds and kinds[-1] == "run_completed"


async def test_result_skips_a_three_day_timer_in_real_milliseconds() -> None:
    async with WorkflowTestEnv(ALL) as env:
        started = time.monotonic()
        run = await env.start(sleeper, Job(key="b", seconds=3 * DAY))
        out = await env.result(run)
        elapsed = time.monotonic() - started
    assert 3 * DAY <= out < 3 * DAY + SLACK  # result() skipped to the deadline
    assert elapsed < 10, f"three virtual days took {elapsed:.1f} real seconds"


async def test_virtual_start_time_is_database_time() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    async with WorkflowTestEnv(ALL, start=start) as env:
        run = await env.start(sleeper, Job(key="c", seconds=60))
        snap = await env.get(run)
        assert start <= snap.created_at < start + timedelta(minutes=1)
        assert 60 <= await env.result(run) < 60 + SLACK


async def test_approval_timeout_reached_by_skipping_three_days() -> None:
    async with WorkflowTestEnv(ALL) as env:
        run = await env.start(needs_approval, Job(key="d"))
        assert (await env.get(run)).status == RunStatus.WAITING_APPROVAL
        await env.skip(timedelta(days=3) - timedelta(minutes=1))
        assert (await env.get(run)).status == RunStatus.WAITING_APPROVAL
        await env.skip(timedelta(minutes=2))
        assert (await env.get(run)).status == RunStatus.COMPLETED
        assert await env.result(run) == "timed out"
        assert (await env.step(run, "boss")).status == StepStatus.TIMED_OUT


async def test_approval_needs_the_group_and_resumes_the_run() -> None:
    async with WorkflowTestEnv(ALL) as env:
        run = await env.start(needs_approval, Job(key="e"))
        with pytest.raises(Forbidden):
            await env.approve(run, "boss", approver="mallory", groups=["staff"])
        resolved = await env.approve(
            run, "boss", approver="alice", groups=["bosses"], payload={"limit": 5}
        )
        assert resolved
        assert await env.result(run) == "approved by alice with {'limit': 5}"


async def test_signals_are_buffered_consumed_in_order_and_time_out() -> None:
    async with WorkflowTestEnv(ALL) as env:
        run = await env.start(waits_for_signal, Job(key="f", seconds=DAY))
        await env.signal(run, "go", "first")
        snap = await env.get(run)
        assert (snap.status, snap.waiting_name) == (RunStatus.WAITING_SIGNAL, "go")
        await env.skip(timedelta(days=1, minutes=1))
        assert await env.result(run) == ["first", "none"]

        early = await env.start(waits_for_signal, Job(key="g"), settle=False)
        await env.signal(early, "go", 1)  # before the run ever executed: buffered
        await env.signal(early, "go", 2)
        assert await env.result(early) == ["1", "2"]


async def test_cancel_runs_compensations_in_reverse_order() -> None:
    undone.clear()
    async with WorkflowTestEnv(ALL) as env:
        run = await env.start(saga, Job(key="h"))
        assert (await env.get(run)).status == RunStatus.WAITING_SIGNAL
        snap = await env.cancel(run, reason="customer changed their mind")
        assert (snap.status, snap.reason) == (RunStatus.CANCELLED, "canceled_by_request")
        assert undone == ["h-hotel-booking", "h-flight-booking"]
        by_id = {s.step_id: s.status for s in await env.steps(run)}
        assert by_id["flight"] == by_id["hotel"] == StepStatus.COMPENSATED
        assert by_id["hotel__compensate"] == StepStatus.SUCCEEDED
        with pytest.raises(RunNotCompleted, match="cancelled"):
            await env.result(run)


async def test_retry_backoff_is_skipped_by_result() -> None:
    async with WorkflowTestEnv(ALL) as env:
        run = await env.start(retrying, Job(key="i"))
        snap = await env.get(run)
        assert (snap.status, snap.waiting_kind) == (RunStatus.RETRYING, "retry")
        assert await env.result(run) == 3
        assert (await env.step(run, "flaky")).attempt == 3
        # Two back-offs of 600 s each went by on the virtual clock.
        assert env.now() - datetime.now(UTC) >= timedelta(seconds=1190)


async def test_blocked_failed_and_invalid_runs_are_reported() -> None:
    async with WorkflowTestEnv(ALL) as env:
        blocked = await env.start(saga, Job(key="j"))
        with pytest.raises(RunBlocked, match="signal 'confirm'"):
            await env.result(blocked)

        failed = await env.start(failing, Job(key="k"))
        with pytest.raises(RunNotCompleted) as info:
            await env.result(failed)
        assert info.value.snapshot.status == RunStatus.FAILED
        assert info.value.snapshot.reason == "failure_non_retryable"

        with pytest.raises(InvalidInput):
            await env.start(sleeper, {"key": 5})


async def test_the_clock_never_goes_back() -> None:
    async with WorkflowTestEnv(ALL) as env:
        with pytest.raises(ValueError, match="forward"):
            await env.skip(-1)


async def test_children_run_in_the_same_environment_and_share_its_clock() -> None:
    async with WorkflowTestEnv(ALL) as env:
        run = await env.start(parent, Job(key="p"))
        snap = await env.get(run)
        assert snap.status == RunStatus.WAITING_CHILD
        # Both children were created by the parent's first execution, in parallel: the
        # first child's suspension waited for the second's journal work (see
        # RunExecution.journaling), so both started their sleep at the same instant.
        children = [s for s in await env.steps(run) if s.kind == "child"]
        assert len(children) == 2
        await env.skip(timedelta(days=1, minutes=1))
        assert (await env.get(run)).status == RunStatus.WAITING_CHILD  # the 2-day one
        one_day, two_days = await env.result(run)
        assert DAY + 60 <= one_day < DAY + 60 + SLACK  # fired by the skip above
        assert 2 * DAY <= two_days < 2 * DAY + SLACK  # fired by result()
        children = [s for s in await env.steps(run) if s.kind == "child"]
        assert [c.status for c in children] == [StepStatus.SUCCEEDED] * 2


@workflow("kit-mistyped")
async def mistyped(ctx: WorkflowContext, job: Job) -> str:
    wrong: Any = 5  # not the declared str: pydantic warns while serializing the output
    return typing.cast(str, wrong)


@pytest.mark.filterwarnings("error::UserWarning")
async def test_an_execution_crashing_in_the_engine_is_reported_at_once() -> None:
    # With warnings as errors the serializer's warning escapes the executor: the worker
    # logs "execution crashed" and the run stays leased until its lease expires (30 s).
    async with WorkflowTestEnv([mistyped]) as env:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="crashed"):
            await env.start(mistyped, Job(key="m"))
        assert time.monotonic() - started < 10
        assert (await env.get(await _only_run(env))).status == RunStatus.RUNNING


async def _only_run(env: WorkflowTestEnv) -> uuid.UUID:
    from sqlalchemy import select

    from app.db.tables import runs

    async with env.database.read() as conn:
        run_id: uuid.UUID = (await conn.execute(select(runs.c.run_id))).scalar_one()
    return run_id


class PaidOrder(BaseModel):
    order_id: str


@workflow("tk-on-paid", on_event="tk.paid")
async def tk_on_paid(ctx: WorkflowContext, order: PaidOrder) -> str:
    return f"started for {order.order_id}"


@workflow("tk-await-paid")
async def tk_await_paid(ctx: WorkflowContext, order: PaidOrder) -> Any:
    try:
        got = await ctx.wait_for_event("tk.paid", match={"order_id": order.order_id}, timeout=60)
    except WaitTimedOut:
        return "timed out"
    return got.data


async def test_post_event_starts_triggers_and_resumes_waits() -> None:
    async with WorkflowTestEnv([tk_on_paid, tk_await_paid]) as env:
        waiting = await env.start(tk_await_paid, PaidOrder(order_id="o1"))
        await env.run_until_idle()
        assert (await env.get(waiting)).status == RunStatus.WAITING_EVENT
        started, resumed = await env.post_event("tk.paid", {"order_id": "o1", "amount": 3})
        assert resumed == [waiting.run_id] and len(started) == 1
        assert await env.result(waiting) == {"order_id": "o1", "amount": 3}
        # A wait with nothing posted times out on the virtual clock, in real milliseconds.
        late = await env.start(tk_await_paid, PaidOrder(order_id="o2"))
        assert await env.result(late) == "timed out"
