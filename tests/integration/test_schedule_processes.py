"""Three scheduler *processes* race one schedule for 200 time-skipped ticks: 200 runs."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from app.core.settings import Settings
from app.db.database import Database
from app.db.tables import runs, schedule_fires
from app.engine import schedules as engine
from tests.helpers import wait_for_sync
from tests.integration.test_schedules import T0, _create, _setup

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)  # three interpreters start on a loaded machine


async def test_three_scheduler_processes_fire_200_ticks_exactly_once(
    settings: Settings, db: Database, database_url: str, tmp_path: Path
) -> None:
    submitter = await _setup(db, settings)
    await _create(
        db,
        submitter,
        T0,
        overlap=engine.Overlap.ALLOW_ALL,
        catchup_window_seconds=86400,
        jitter_seconds=20,
    )
    # Tick 200 is 15:20:00 and fires within its 20 s jitter; tick 201 (15:21) is after.
    end = T0.replace(second=0) + timedelta(minutes=200, seconds=30)
    speed = 1200.0  # one virtual minute every 50 ms
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.schedule_racer",
                database_url,
                T0.isoformat(),
                str(go),
                str(speed),
                end.isoformat(),
                f"racer-{i}",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(3)
    ]
    # Start the clock only once all three are connected (a loaded machine starts slowly).
    wait_for_sync(
        lambda: all((tmp_path / f"go.racer-{i}.ready").exists() for i in range(3)),
        timeout=60,
        what="three racers ready",
    )
    tmp = tmp_path / "go.tmp"
    tmp.write_text(str(time.time()))
    tmp.rename(go)
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
    async with db.read() as conn:
        n_runs = (await conn.execute(select(func.count()).select_from(runs))).scalar()
        ticks = (await conn.execute(select(schedule_fires.c.tick, schedule_fires.c.fired_by))).all()
    expected = [T0.replace(second=0) + timedelta(minutes=i) for i in range(1, 201)]
    assert sorted(t for t, _ in ticks) == expected
    assert n_runs == 200
    assert len({who for _, who in ticks}) >= 2, outputs  # a real race, not one process
    started = [int(out.split("started=")[1].split()[0]) for out in outputs]
    assert sum(started) == len(expected), outputs
