"""Schema migrations (Alembic only) and the start-up schema check.

The API and workers refuse to start against a schema that is behind or ahead of the code's
Alembic head; ``treadle migrate`` brings it to head.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from alembic import command
from app.core.errors import SchemaVersionMismatch
from app.db.database import Database
from app.db.faults import classify

# Where the wheel carries the migrations (pyproject.toml maps the repository's top-level
# alembic/ and alembic.ini here; docs/adr/0014-packaging.md).
PACKAGED_DIRECTORY = "_alembic"


class MigrationsNotFound(RuntimeError):
    """Neither the packaged migrations nor a source checkout's ``alembic/`` exist.

    A broken install, not a user error: the wheel always carries ``app/_alembic``.
    """


def migrations_location() -> tuple[Path, Path]:
    """Return ``(alembic.ini, script directory)`` of the migrations this code ships.

    An installed wheel carries them inside the package (``app/_alembic``, found with
    :mod:`importlib.resources`, so it works from any ``site-packages``); a source checkout
    (an editable install, the repository's tests) has them at the top level beside ``app/``.

    Raises:
        MigrationsNotFound: neither exists (a damaged install).
    """
    # Installed wheels are unpacked directories, so the resource is a real path that
    # Alembic (which reads files and imports env.py by path) can use as it is.
    packaged = Path(str(resources.files("app").joinpath(PACKAGED_DIRECTORY)))
    if (packaged / "env.py").is_file():
        return packaged / "alembic.ini", packaged
    checkout = Path(str(resources.files("app"))).parent
    if (checkout / "alembic" / "env.py").is_file():
        return checkout / "alembic.ini", checkout / "alembic"
    raise MigrationsNotFound(
        f"no migrations found in {packaged} or {checkout / 'alembic'}: reinstall treadle"
    )


def alembic_config(database_url: str) -> Config:
    """Return an Alembic ``Config`` for the shipped migrations, bound to ``database_url``.

    Raises:
        MigrationsNotFound: the install has no migrations.
    """
    ini, scripts = migrations_location()
    cfg = Config(str(ini))
    cfg.set_main_option("script_location", str(scripts))
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
    """Return the revision recorded in ``alembic_version``, or None for an empty database.

    Raises:
        DBAPIError: a transient fault (:func:`app.db.faults.classify`): a server going
            down mid-query is not an empty database (the caller would refuse to start,
            saying "run treadle migrate").
    """
    async with db.read() as conn:
        try:
            row = (await conn.execute(text("SELECT version_num FROM alembic_version"))).first()
        except DBAPIError as exc:
            if classify(exc) is not None:
                raise
            return None  # no alembic_version table: nothing migrated yet
    return None if row is None else str(row[0])


def _ahead(current: str, head: str) -> SchemaVersionMismatch:
    return SchemaVersionMismatch(
        f"database schema is at {current}, which this code does not know (it is ahead of "
        f"{head}): deploy the newer Treadle release that migrated it",
        current=current,
        head=head,
    )


async def check_upgradable(db: Database) -> None:
    """Refuse to migrate a schema this code does not know (``treadle migrate``'s check).

    Behind or empty is what ``treadle migrate`` is for; at head it has nothing to do.

    Raises:
        SchemaVersionMismatch: ahead (a newer release migrated this database: Alembic
            would fail with "Can't locate revision").
    """
    current = await current_revision(db)
    if current is None or current == head_revision():
        return
    script = ScriptDirectory.from_config(alembic_config(db.url))
    if current not in {rev.revision for rev in script.walk_revisions()}:
        raise _ahead(current, head_revision())


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
    raise _ahead(current, head)
