"""``TREADLE_DB_POOLER`` and ``TREADLE_LISTEN_DATABASE_URL``: what each process connects with."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.settings import DbPooler, Settings
from app.db.database import pg_connect_args

PG = "postgresql+asyncpg://u@db:5432/treadle"
BOUNCER = "postgresql+asyncpg://u@pgbouncer:6432/treadle"


def test_listen_url_is_direct_or_none_behind_a_transaction_pooler() -> None:
    assert Settings(database_url=PG).listen_url == PG
    assert Settings(database_url=BOUNCER, db_pooler=DbPooler.TRANSACTION).listen_url is None
    pooled = Settings(database_url=BOUNCER, db_pooler="transaction", listen_database_url=PG)
    assert pooled.listen_url == PG
    assert Settings(database_url="sqlite+aiosqlite:///x.db").listen_url is None


def test_pooler_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ValidationError, match="TREADLE_DB_POOLER is for PostgreSQL"):
        Settings(database_url="sqlite+aiosqlite:///x.db", db_pooler="transaction")
    with pytest.raises(ValidationError, match="TREADLE_LISTEN_DATABASE_URL must be"):
        Settings(database_url=PG, listen_database_url="sqlite+aiosqlite:///x.db")


def test_connect_args_direct_and_pooled() -> None:
    direct = pg_connect_args(Settings(database_url=PG, db_statement_timeout_seconds=2.5))
    assert direct == {"server_settings": {"statement_timeout": "2500"}}
    pooled = pg_connect_args(Settings(database_url=BOUNCER, db_pooler="transaction"))
    assert "server_settings" not in pooled
    assert pooled["statement_cache_size"] == 0 and pooled["prepared_statement_cache_size"] == 0
    assert pooled["prepared_statement_name_func"]() == ""
