"""Time partitions on PostgreSQL: bounds, names, and what schema comparison ignores.

``steps``, ``events`` and ``runs_archive`` are ``PARTITION BY RANGE (run_id)`` on
PostgreSQL (revision 0023, docs/adr/0036-time-partitions.md). Run ids are UUIDv7
(RFC 9562 §5.7, minted by app/core/ids.py ``new_run_id``): their first 48 bits are the
Unix time in milliseconds, and PostgreSQL compares ``uuid`` bytewise, so the ids of runs
created in ``[lo, hi)`` are exactly those in ``[bound(lo), bound(hi))``. A run's steps and
events live in the partition of the run's creation time, however long it runs; dropping
the partition is dropping whole runs' journals, never part of one.

Partitions are named ``<table>_p<YYYYMMDD>`` after the UTC day they start, plus one
``<table>_default`` for ids outside every range (not version 7, or a week nobody created
ahead): rows are never refused for want of a partition.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

PARTITIONED_TABLES: tuple[str, ...] = ("steps", "events", "runs_archive")
"""The tables partitioned by run id on PostgreSQL (SQLite keeps them plain)."""

_PARTITION_NAME = re.compile(rf"^(?:{'|'.join(PARTITIONED_TABLES)})_(?:p\d{{8}}|default)$")


def bound(at: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of the millisecond ``at``: the partition bound of that instant.

    Raises:
        ValueError: ``at`` is naive, or before 1970 (no UUIDv7 has that time).
    """
    if at.tzinfo is None:
        raise ValueError("naive datetimes are refused; pass a timezone-aware UTC value")
    ms = int(at.timestamp() * 1000)
    if ms < 0:
        raise ValueError(f"{at.isoformat()} is before the Unix epoch")
    return uuid.UUID(int=ms << 80)


def time_of(run_id: uuid.UUID) -> datetime:
    """The UTC instant (millisecond) a UUIDv7 carries; the inverse of :func:`bound`."""
    return datetime.fromtimestamp((run_id.int >> 80) / 1000, tz=UTC)


def partition_name(table: str, lower: datetime) -> str:
    """``<table>_pYYYYMMDD``: the partition of ``table`` starting on ``lower``'s UTC day."""
    return f"{table}_p{lower.astimezone(UTC):%Y%m%d}"


def is_partition(name: str) -> bool:
    """Whether ``name`` is one of our partitions (not a table of ``app.db.tables``)."""
    return _PARTITION_NAME.match(name) is not None


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic's ``include_name`` hook: compare the partitioned parents, not partitions.

    The partitions are made by revision 0023 and by maintenance, not by ``tables.py``; a
    comparison of the metadata with the database must not read them as stray tables.
    """
    return not (type_ == "table" and name is not None and is_partition(name))


def include_object_for(dialect: str) -> Callable[[object, str | None, str, bool, object], bool]:
    """Alembic's ``include_object`` hook for ``dialect``: skip another dialect's objects.

    A constraint or index of ``tables.py`` made for one dialect only (``.ddl_if(dialect=
    …)``: the SQLite-only tenant-leading unique keys beside a rowid, revision 0027,
    docs/adr/0034-tenant-leading-keys.md) is created by neither ``create_all`` nor the
    migrations on the other, so a comparison there must not ask for it. Reflected objects
    are always kept: a stray one in the database is still reported.
    """

    def include_object(
        obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
    ) -> bool:
        condition = getattr(obj, "_ddl_if", None)
        if reflected or condition is None or condition.dialect is None:
            return True
        wanted = condition.dialect
        return dialect == wanted if isinstance(wanted, str) else dialect in wanted

    return include_object
