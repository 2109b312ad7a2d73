"""Schema migrations (Alembic only) and the start-up schema check.

The API and workers refuse to start against a schema that is behind or ahead of the code's
Alembic head; ``treadle migrate`` brings it to head.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from alembic import command
from app.core.errors import SchemaVersionMismatch
from app.db.database import Database

_ROOT = Path(__file__).resolve().parent.parent.parent


def alembic_config(database_url: str) -> Config:
    """Return an Alembic ``Config`` for this checkout, bound to ``database_url``."""
    cfg = Config(str(_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(_ROOT / "alembic"))
    cfg.attributes["database_url"] = database_url
    return cfg


def head_revision() -> str:
    """Return the single Alembic head revision id of this code."""
    heads = ScriptDirectory.from_config(alembic_config("unused")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"expected one Alembic head, found {heads}")
    return heads[0]


def upgrade_to_head(database_url: str) -> None:
    """Run ``alembic upgrade head`` (blocking; call from a thread inside an event loop)."""
    command.upgrade(alembic_config(database_url), "head")


async def migrate(database_url: str) -> None:
    """Upgrade the database to head without blocking the caller's event loop."""
    await asyncio.to_thread(upgrade_to_head, database_url)


async def current_revision(db: Database) -> str | None:
    """Return the revision recorded in ``alembic_version``, or None for an empty database."""
    async with db.read() as conn:
        try:
            row = (await conn.execute(text("SELECT version_num FROM alembic_version"))).first()
        except DBAPIError:
            return None
    return None if row is None else str(row[0])


async def check_schema(db: Database) -> None:
    """Refuse to run against a schema that is not exactly at this code's head.

    Raises:
        SchemaVersionMismatch: behind (run ``treadle migrate``) or ahead (newer code
            migrated this database; deploy that code).
    """
    head = head_revision()
    current = await current_revision(db)
    if current == head:
        return
    script = ScriptDirectory.from_config(alembic_config(db.url))
    known = {rev.revision for rev in script.walk_revisions()}
    if current is None or current in known:
        raise SchemaVersionMismatch(
            f"database schema is at {current or 'nothing (empty database)'}, this code needs "
            f"{head}: run `treadle migrate`",
            current=current,
            head=head,
        )
    raise SchemaVersionMismatch(
        f"database schema is at {current}, which this code does not know (it is ahead of "
        f"{head}): deploy the newer Treadle release that migrated it",
        current=current,
        head=head,
    )
