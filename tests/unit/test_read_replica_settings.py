"""``TREADLE_READ_DATABASE_URL``: PostgreSQL beside PostgreSQL only; unset means no replica."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.settings import Settings
from app.db.database import Database

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
