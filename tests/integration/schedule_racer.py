"""A scheduler loop in its own process, on a fast-forwarded clock (for the race test).

``python -m tests.integration.schedule_racer URL ORIGIN GO_FILE SPEED END NAME``: the
process connects, writes ``GO_FILE.NAME.ready``, waits for ``GO_FILE`` to hold the wall
time WALL0, then runs on virtual time ``ORIGIN + (time.time() - WALL0) * SPEED`` capped
at ``END``: several processes agree on "now" while minutes pass in milliseconds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from app.core.settings import Settings
from app.db.database import Database
from app.engine.schedules import Scheduler


async def main(
    url: str, origin: datetime, go_file: Path, speed: float, end: datetime, name: str
) -> None:
    """Fire ticks until virtual time reaches ``end``, then drain what is left."""
    settings = Settings(database_url=url, dev_secret="x" * 32, db_pool_size=2)
    db = Database(settings)
    await db.now()  # connected and warm before the start signal
    Path(f"{go_file}.{name}.ready").write_text("ready")
    while not go_file.exists() or not go_file.read_text().strip():
        await asyncio.sleep(0.01)
    wall0 = float(go_file.read_text())

    async def clock() -> datetime:
        virtual = origin + timedelta(seconds=(time.time() - wall0) * speed)
        return min(virtual, end)

    scheduler = Scheduler(db, settings, clock=clock, scheduler_id=name)
    try:
        while await clock() < end:
            await scheduler.run_once()
            await asyncio.sleep(0.005)
        while True:  # drain: a pass fires at most 100 ticks
            done = await scheduler.run_once()
            if not (done.started or done.already_fired or done.missed):
                break
    finally:
        await db.dispose()
    print(f"{name} started={scheduler.totals.started} seen={scheduler.totals.already_fired}")


if __name__ == "__main__":
    url, origin, go, speed, end, name = sys.argv[1:7]
    asyncio.run(
        main(
            url,
            datetime.fromisoformat(origin).astimezone(UTC),
            Path(go),
            float(speed),
            datetime.fromisoformat(end).astimezone(UTC),
            name,
        )
    )
