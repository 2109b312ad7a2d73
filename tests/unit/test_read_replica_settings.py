"""``TREADLE_READ_DATABASE_URL``: PostgreSQL beside PostgreSQL only; unset means no replica."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.settings import Settings
from app.db.database import Database
from app.db.replica import heartbeat_interval

PG = "postgresql+asyncpg://u@127.0.0.1:1/db"


def test_a_replica_of_a_postgresql_primary_is_accepted() -> None:
    settings = Settings(database_url=PG, read_database_url=PG.replace(":1/", ":2/"))
    assert settings.read_database_url.endswith(":2/db")
    assert settings.read_max_lag_seconds == 30.0


@pytest.mark.parametrize(
    ("primary", "replica"),
    [
        ("sqlite+aiosqlite:///x.db", PG),  # SQLite has no replicas
        (PG, "sqlite+aiosqlite:///x.db"),
        ("", PG),  # the default primary is SQLite
    ],
)
def test_anything_else_is_refused_naming_the_variable(primary: str, replica: str) -> None:
    with pytest.raises(ValidationError, match="TREADLE_READ_DATABASE_URL needs PostgreSQL"):
        Settings(database_url=primary, read_database_url=replica)


async def test_unset_means_lagging_reads_are_plain_reads_of_the_primary() -> None:
    db = Database(Settings(database_url="sqlite+aiosqlite:///:memory:"))
    try:
        assert not db.has_replica
        async with db.lagging_read() as conn:
            assert (await conn.exec_driver_sql("SELECT 1")).scalar_one() == 1
        assert "replica" not in db._pools
    finally:
        await db.dispose()


@pytest.mark.parametrize(
    ("max_lag", "interval"),
    [
        (30.0, 1.0),  # the default bound: one beat a second
        (86400.0, 1.0),  # never slower
        (1.0, 0.5),  # half a short bound, so an idle standby stays inside it
        (0.01, 0.1),  # never faster than 0.1 s
    ],
)
def test_the_heartbeat_keeps_well_inside_the_lag_bound(max_lag: float, interval: float) -> None:
    # docs/adr/0049-replica-lag-from-a-heartbeat.md
    assert heartbeat_interval(max_lag) == interval
    assert heartbeat_interval(Settings(read_max_lag_seconds=max_lag).read_max_lag_seconds) == (
        interval
    )
