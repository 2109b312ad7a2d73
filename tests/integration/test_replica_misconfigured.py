"""A read replica that is misconfigured or down: reads go to the primary, metrics say so.

``TREADLE_READ_DATABASE_URL`` naming a database that does not exist there (SQLSTATE
3D000 at connect, not a class :func:`app.db.faults.classify` calls ``unavailable``) must
not answer 503 forever: the read is the primary's, with one warning. While the replica
cannot be reached, ``treadle_db_replica_lag_seconds`` is NaN and ``treadle_db_replica_up``
0, never a stale healthy-looking lag (docs/deployment.md, "Read replica").
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import structlog
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.core import metrics
from app.db.database import Database
from tests.acceptance.conftest import free_port
from tests.conftest import make_settings

PG_ONLY = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


async def _read_database(db: Database) -> str:
    async with db.lagging_read() as conn:
        return str((await conn.execute(text("SELECT current_database()"))).scalar_one())


def _sample(name: str, labels: dict[str, str] | None = None) -> float | None:
    return REGISTRY.get_sample_value(name, labels or {})


@PG_ONLY
async def test_a_replica_database_that_does_not_exist_falls_back_with_one_warning(
    database_url: str, tmp_path: Path
) -> None:
    primary = make_url(database_url)
    missing = primary.set(database="treadle_no_such_replica_db").render_as_string(False)
    db = Database(make_settings(database_url, tmp_path, read_database_url=missing))
    before = _sample("treadle_db_replica_fallbacks_total", {"reason": "unavailable"}) or 0.0
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                assert await _read_database(db) == primary.database
        warnings = [e for e in logs if e["event"].startswith("read replica not used")]
        assert len(warnings) == 1, logs
        assert warnings[0]["reason"] == "unavailable"
        assert "does not exist" in warnings[0]["error"], warnings
        after = _sample("treadle_db_replica_fallbacks_total", {"reason": "unavailable"})
        assert after == before + 3
        assert _sample("treadle_db_replica_up") == 0
    finally:
        await db.dispose()


@PG_ONLY
async def test_the_lag_gauge_is_nan_while_the_replica_is_down(
    database_url: str, tmp_path: Path
) -> None:
    primary = make_url(database_url)
    # Another database of the same server stands in for a healthy replica (not in
    # recovery: lag 0), then a port with nothing listening for one that is down.
    healthy = primary.set(database="postgres").render_as_string(False)
    db = Database(make_settings(database_url, tmp_path, read_database_url=healthy))
    try:
        with structlog.testing.capture_logs() as logs:
            assert await _read_database(db) == "postgres"
            assert await _read_database(db) == "postgres"
        assert _sample("treadle_db_replica_lag_seconds") == 0.0
        assert _sample("treadle_db_replica_up") == 1
        # Not a standby: served, but offloading nothing, said once and shown.
        assert _sample("treadle_db_replica_in_recovery") == 0
        said = [e for e in logs if e["event"].startswith("read replica is a primary")]
        assert len(said) == 1 and said[0]["log_level"] == "warning", logs
    finally:
        await db.dispose()
    down = primary.set(port=free_port()).render_as_string(False)
    db = Database(make_settings(database_url, tmp_path, read_database_url=down))
    try:
        assert await _read_database(db) == primary.database
        lag = _sample("treadle_db_replica_lag_seconds")
        assert lag is not None and math.isnan(lag), lag
        assert _sample("treadle_db_replica_up") == 0
    finally:
        await db.dispose()
        metrics.DB_REPLICA_LAG.set(0)
