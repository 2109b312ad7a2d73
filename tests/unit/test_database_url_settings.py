"""Database URL mistakes fail at start with one message saying what to write.

``postgresql://`` / ``sqlite://`` (no async driver) are normalized to the driver Treadle
runs on; another driver is refused naming the right scheme; a read URL that is the
primary itself is refused (docs/deployment.md, "Database URLs").
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.settings import Settings, format_settings_error, normalize_database_url


@pytest.mark.parametrize(
    ("written", "used"),
    [
        ("postgresql://u:p@db:5432/treadle", "postgresql+asyncpg://u:p@db:5432/treadle"),
        (
            "postgres://u@db/treadle?sslmode=require",
            "postgresql+asyncpg://u@db/treadle?sslmode=require",
        ),
        ("postgresql+asyncpg://u@db/t", "postgresql+asyncpg://u@db/t"),
        ("sqlite:///tmp/t.db", "sqlite+aiosqlite:///tmp/t.db"),
        ("sqlite+aiosqlite:///tmp/t.db", "sqlite+aiosqlite:///tmp/t.db"),
    ],
)
def test_a_url_without_the_async_driver_is_given_it(written: str, used: str) -> None:
    assert normalize_database_url(written) == used
    assert Settings(database_url=written, auth_mode="dev").database_url == used


def test_the_read_and_listen_urls_are_normalized_too() -> None:
    settings = Settings(
        database_url="postgresql://u@primary/t",
        read_database_url="postgresql://u@standby/t",
        listen_database_url="postgres://u@primary/t",
    )
    assert settings.read_database_url == "postgresql+asyncpg://u@standby/t"
    assert settings.listen_url == "postgresql+asyncpg://u@primary/t"


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("postgresql+psycopg://u@db/t", "write postgresql+asyncpg://"),
        ("postgresql+psycopg2://u@db/t", "write postgresql+asyncpg://"),
        ("sqlite+pysqlite:///t.db", "write sqlite+aiosqlite://"),
        ("mysql+aiomysql://u@db/t", "Treadle runs on PostgreSQL"),
        ("/var/lib/treadle.db", "not a database URL"),
    ],
)
def test_another_driver_is_refused_saying_what_to_write(written: str, says: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(database_url=written)
    message = format_settings_error(err.value)
    assert message.startswith("TREADLE_DATABASE_URL: ")
    assert says in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "replica",
    [
        "postgresql+asyncpg://u@db:5432/t",
        "postgresql://other-user:pw@DB/t",  # same server and database, other credentials
        "postgresql+asyncpg://u@db/t?application_name=x",
    ],
)
def test_a_read_url_that_is_the_primary_is_refused(replica: str) -> None:
    with pytest.raises(ValidationError, match="same database as TREADLE_DATABASE_URL"):
        Settings(database_url="postgresql+asyncpg://u@db/t", read_database_url=replica)


@pytest.mark.parametrize(
    "replica",
    [
        "postgresql+asyncpg://u@db:5433/t",
        "postgresql+asyncpg://u@standby/t",
        "postgresql+asyncpg://u@db/other",
    ],
)
def test_a_read_url_elsewhere_is_accepted(replica: str) -> None:
    settings = Settings(database_url="postgresql+asyncpg://u@db/t", read_database_url=replica)
    assert settings.read_database_url == replica


def test_the_start_timeout_is_a_bounded_setting() -> None:
    assert Settings().db_start_timeout_seconds == 60.0
    assert Settings(db_start_timeout_seconds=0).db_start_timeout_seconds == 0
    with pytest.raises(ValidationError, match="db_start_timeout_seconds"):
        Settings(db_start_timeout_seconds=-1)
