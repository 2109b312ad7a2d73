"""app.core.tasks.cancel_and_wait: background tasks end even when one loses a cancellation."""

from __future__ import annotations

import asyncio

from app.core.tasks import cancel_and_wait


async def test_a_task_that_loses_its_first_cancellation_still_ends() -> None:
    lost = 0
    started = asyncio.Event()

    async def helper_loop() -> None:
        # What Python 3.11's wait_for does when the awaited call completes as the cancel
        # arrives (gh-86296): the CancelledError never reaches the loop, which carries on.
        nonlocal lost
        started.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost += 1

    looping = asyncio.create_task(helper_loop())
    failed = asyncio.create_task(asyncio.sleep(0))
    await started.wait()
    await failed  # already done: nothing to cancel
    await asyncio.wait_for(cancel_and_wait([looping, failed], recancel_seconds=0.01), 10)
    assert lost == 1 and looping.cancelled()


async def test_exceptions_of_cancelled_tasks_are_retrieved() -> None:
    async def boom_on_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.create_task(boom_on_cancel())
    await asyncio.sleep(0)
    await cancel_and_wait([task])
    assert isinstance(task.exception(), RuntimeError)
