"""Catalog reads and DDL of the time partitions (PostgreSQL only).

docs/adr/0036-time-partitions.md. Functions take the connection first and never begin
or commit: maintenance (app/engine/maintenance.py) runs each one in its own short
transaction. Every DDL statement here first sets a local ``lock_timeout``: attaching or
dropping a partition needs a lock on the parent that waits for every query in flight on
it, and a DDL statement that waits also blocks every query queued behind it. Better to
give up after :data:`DDL_LOCK_TIMEOUT` and try again next run than to stall the workers.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.partitions import bound, partition_name, time_of

DDL_LOCK_TIMEOUT = "5s"
"""How long a partition DDL statement may wait for its lock before giving up."""

PARTITION_LOCK_KEY = 0x74726561646C6570  # "treadlep"; any constant shared by every process
"""Advisory lock key serialising partition changes between maintenance runs."""

_RANGE = re.compile(r"FROM \('([0-9a-f-]{36})'\) TO \('([0-9a-f-]{36})'\)")


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of a partitioned table.

    Attributes:
        table: the partitioned (parent) table.
        name: the partition's own table name.
        lower: the first run id it holds (None for the default partition).
        upper: the first run id it no longer holds (None for the default partition).
    """

    table: str
    name: str
    lower: uuid.UUID | None
    upper: uuid.UUID | None

    @property
    def is_default(self) -> bool:
        """Whether this is the ``DEFAULT`` partition (rows outside every range)."""
        return self.lower is None

    @property
    def starts(self) -> datetime | None:
        """Run creation time the range starts at (None for the default partition)."""
        return None if self.lower is None else time_of(self.lower)

    @property
    def ends(self) -> datetime | None:
        """Run creation time the range ends before (None for the default partition)."""
        return None if self.upper is None else time_of(self.upper)


async def is_partitioned(conn: AsyncConnection, table: str) -> bool:
    """Whether ``table`` is a partitioned table here (False on SQLite, or before 0023)."""
    if conn.dialect.name != "postgresql":
        return False
    found = await conn.execute(
        text(
            "SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
            "WHERE c.oid = to_regclass(:t)"
        ),
        {"t": table},
    )
    return found.first() is not None


async def list_partitions(conn: AsyncConnection, table: str) -> list[Partition]:
    """The partitions of ``table``, ranges in order, the default partition last."""
    rows = await conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:t)"
        ),
        {"t": table},
    )
    found: list[Partition] = []
    for name, spec in rows.all():
        m = _RANGE.search(spec)
        if m is None:  # "DEFAULT"
            found.append(Partition(table, name, None, None))
        else:
            found.append(Partition(table, name, uuid.UUID(m[1]), uuid.UUID(m[2])))
    return sorted(found, key=lambda p: (p.lower is None, p.lower or uuid.UUID(int=0)))


async def serialize(conn: AsyncConnection) -> None:
    """Wait for any other maintenance run's partition change, until this transaction ends.

    Two maintenance runs at once (a cron job and ``POST /admin/maintenance``) would
    otherwise create the same partition twice, or one would drop what the other is
    about to; the caller lists the partitions again after this.
    """
    await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PARTITION_LOCK_KEY})


async def _lock_timeout(conn: AsyncConnection) -> None:
    await conn.execute(text(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"))


async def create_partition(
    conn: AsyncConnection, table: str, lower: datetime, upper: datetime
) -> str:
    """Create and attach the partition of ``table`` for runs created in ``[lower, upper)``.

    Built beside the table and then attached (``ATTACH PARTITION`` locks the parent
    ``SHARE UPDATE EXCLUSIVE``: reads and writes go on; ``CREATE TABLE … PARTITION OF``
    would lock it ``ACCESS EXCLUSIVE``). Rows of that range already in the default
    partition (maintenance ran late) are moved into it first, in the same transaction.
    It takes the storage parameters (``reloptions``) of the newest range partition.

    Returns:
        The new partition's name.
    """
    name = partition_name(table, lower)
    lo, hi = str(bound(lower)), str(bound(upper))
    await _lock_timeout(conn)
    await conn.execute(
        text(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING STORAGE)")
    )
    existing = await list_partitions(conn, table)
    newest = [p for p in existing if not p.is_default]
    if newest:
        # Storage parameters live on each partition (a partitioned parent has none): the
        # new one takes the newest one's, e.g. an operator's autovacuum settings.
        options = (
            await conn.execute(
                text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:t)"),
                {"t": newest[-1].name},
            )
        ).scalar()
        if options:
            await conn.execute(text(f"ALTER TABLE {name} SET ({', '.join(options)})"))
    default = next((p.name for p in existing if p.is_default), None)
    if default is not None:
        await conn.execute(
            text(
                f"WITH moved AS (DELETE FROM {default} WHERE run_id >= CAST(:lo AS uuid) "
                f"AND run_id < CAST(:hi AS uuid) RETURNING *) "
                f"INSERT INTO {name} SELECT * FROM moved"
            ),
            {"lo": lo, "hi": hi},
        )
    # The CHECK lets ATTACH skip its validating scan of the new table; it is then redundant.
    await conn.execute(
        text(
            f"ALTER TABLE {name} ADD CONSTRAINT {name}_bounds "
            f"CHECK (run_id IS NOT NULL AND run_id >= '{lo}' AND run_id < '{hi}')"
        )
    )
    await conn.execute(
        text(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ('{lo}') TO ('{hi}')")
    )
    await conn.execute(text(f"ALTER TABLE {name} DROP CONSTRAINT {name}_bounds"))
    return name


async def create_ahead(
    conn: AsyncConnection, table: str, *, now: datetime, until: datetime, width: timedelta
) -> list[str]:
    """Create partitions of ``table`` after its last one until one covers ``until``.

    Each new partition is ``width`` wide and starts where the last one ends, so a change
    of width applies from the next partition on and ranges never overlap or leave gaps.
    A table with no range partition left starts at ``now``'s UTC midnight.

    Returns:
        The names of the partitions created (none when ``until`` was covered already).
    """
    await serialize(conn)
    ranges = [p for p in await list_partitions(conn, table) if not p.is_default]
    start = ranges[-1].ends if ranges else None
    if start is None:
        start = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    created: list[str] = []
    while start <= until:
        created.append(await create_partition(conn, table, start, start + width))
        start += width
    return created


async def row_count(conn: AsyncConnection, partition: Partition) -> int:
    """Exact rows in one partition (a scan of that partition only)."""
    return int((await conn.execute(text(f"SELECT count(*) FROM {partition.name}"))).scalar_one())


async def newest_at(
    conn: AsyncConnection,
    partition: Partition,
    *,
    column: Literal["at", "finished_at"] = "at",
) -> datetime | None:
    """The latest ``column`` of one partition (None when empty).

    ``at`` for an ``events`` partition, ``finished_at`` for a ``runs_archive`` one; the
    name is one of those two literals, never caller text.
    """
    if column not in ("at", "finished_at"):
        raise ValueError(f"not a partition time column: {column!r}")
    found = await conn.execute(text(f"SELECT max({column}) FROM {partition.name}"))
    value = found.scalar_one()
    assert value is None or isinstance(value, datetime)
    return value


async def drop_partition(conn: AsyncConnection, partition: Partition) -> None:
    """Detach and drop one range partition with every row in it."""
    if partition.is_default:
        raise ValueError("the default partition is never dropped")
    await _lock_timeout(conn)
    await conn.execute(text(f"ALTER TABLE {partition.table} DETACH PARTITION {partition.name}"))
    await conn.execute(text(f"DROP TABLE {partition.name}"))
