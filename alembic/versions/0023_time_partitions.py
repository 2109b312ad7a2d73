"""Time partitions: ``steps``, ``events`` and ``runs_archive`` range-partitioned on PostgreSQL.

docs/adr/0036-time-partitions.md. Each table becomes ``PARTITION BY RANGE (run_id)``:
run ids are UUIDv7 (app/core/ids.py), whose first 48 bits are the Unix time in
milliseconds, so a range of ids is a range of run creation times. The bound of an instant
is the UUID with those 48 bits and zeros after (:func:`_bound`). Partitions are 7 days
wide (``<table>_pYYYYMMDD``, the Monday that starts them), from the week of the oldest
version-7 run id present up to 14 days ahead, plus ``<table>_default`` for anything else
(ids that are not version 7, or a gap maintenance did not fill). From then on
``treadle maintenance`` creates them ahead (``TREADLE_PARTITIONS_AHEAD_DAYS``).

A partitioned table's primary key must contain the partition key: ``steps`` (run_id,
step_id) and ``runs_archive`` (run_id) already do; ``events`` becomes (event_id, run_id)
on PostgreSQL (SQLite keeps ``event_id``, its rowid). event_id stays globally unique all
the same (one sequence, never written explicitly).

The conversion, per table, in the migration's one transaction:

1. ``LOCK … IN SHARE MODE``: writes wait, reads go on.
2. A twin ``<table>__part`` (LIKE the table: columns, NOT NULL, defaults, so ``events``
   keeps ``nextval('events_event_id_seq')``) partitioned by run_id, with its partitions.
3. ``INSERT … SELECT *``: every row moves; then the primary key, unique constraints,
   indexes (under temporary names), foreign keys (same names, validated), grants and
   owner are copied from the catalog, storage parameters go to every partition, and the
   twin is analysed.
4. The swap, for all three tables at the end: ``ACCESS EXCLUSIVE``, the sequence
   re-owned by the twin, the old table dropped, the twin and its index names renamed.
   Only this step blocks reads, until commit.

Downgrade is the same in reverse (plain twins). SQLite: nothing to do.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02 14:00:00.000000
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("steps", "events", "runs_archive")
WIDTH = timedelta(days=7)
AHEAD = timedelta(days=14)
# events' primary key on each side (the only one that changes).
_PK_PARTITIONED = {"events": "PRIMARY KEY (event_id, run_id)"}
_PK_PLAIN = {"events": "PRIMARY KEY (event_id)"}


def _bound(at: datetime) -> str:
    """The smallest UUIDv7 of the millisecond ``at``: its partition bound."""
    ms = int(at.timestamp() * 1000)
    h = f"{ms:012x}"
    return f"{h[:8]}-{h[8:12]}-0000-0000-000000000000"


def _week_start(at: datetime) -> datetime:
    day = datetime(at.year, at.month, at.day, tzinfo=UTC)
    return day - timedelta(days=day.weekday())


def _ranges(oldest: datetime | None, now: datetime) -> list[tuple[datetime, datetime]]:
    start = _week_start(oldest if oldest is not None and oldest < now else now)
    out = []
    while start < now + AHEAD:
        out.append((start, start + WIDTH))
        start += WIDTH
    return out


def _oldest_v7(conn: sa.Connection, table: str) -> datetime | None:
    # Version-7 ids only (the 13th hex digit is the version): anything else goes to the
    # default partition, so a stray id cannot make the migration create decades of weeks.
    text = conn.execute(
        sa.text(
            f"SELECT run_id::text FROM {table} WHERE substr(run_id::text, 15, 1) = '7' "
            "ORDER BY run_id LIMIT 1"  # PostgreSQL 15 has no min(uuid)
        )
    ).scalar()
    if text is None:
        return None
    ms = int(text.replace("-", "")[:12], 16)
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _options(conn: sa.Connection, table: str, *, newest_partition: bool) -> str:
    """`` WITH (…)`` of the table's storage parameters (or its newest partition's); ''."""
    if newest_partition:
        found = conn.execute(
            sa.text(
                "SELECT c.reloptions FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = CAST(:t AS regclass) AND NOT c.relpartbound IS NULL "
                "AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT' ORDER BY c.relname DESC "
                "LIMIT 1"
            ),
            {"t": table},
        ).scalar()
    else:
        found = conn.execute(
            sa.text("SELECT reloptions FROM pg_class WHERE oid = CAST(:t AS regclass)"),
            {"t": table},
        ).scalar()
    return f" WITH ({', '.join(found)})" if found else ""


def _build_twin(conn: sa.Connection, table: str, *, partitioned: bool, now: datetime) -> None:
    twin = f"{table}__part"
    schema = conn.execute(sa.text("SELECT current_schema()")).scalar_one()
    conn.execute(sa.text(f"LOCK TABLE {table} IN SHARE MODE"))
    refs = conn.execute(
        sa.text("SELECT conname FROM pg_constraint WHERE confrelid = CAST(:t AS regclass)"),
        {"t": table},
    ).all()
    if refs:  # nothing refers to these tables; a foreign key that did would be lost
        raise RuntimeError(f"{table} is referenced by {[r[0] for r in refs]}: not converted")
    by = " PARTITION BY RANGE (run_id)" if partitioned else ""
    conn.execute(
        sa.text(
            f"CREATE TABLE {twin} (LIKE {table} INCLUDING DEFAULTS INCLUDING STORAGE "
            f"INCLUDING COMMENTS){by}"
        )
    )
    # Storage parameters (e.g. the autovacuum settings docs/deployment.md suggests for
    # steps) belong to the tables that hold rows: each partition, or the plain twin; on
    # the way back, the newest partition's.
    options = _options(conn, table, newest_partition=not partitioned)
    if partitioned:
        for lo, hi in _ranges(_oldest_v7(conn, table), now):
            conn.execute(
                sa.text(
                    f"CREATE TABLE {table}_p{lo:%Y%m%d} PARTITION OF {twin} "
                    f"FOR VALUES FROM ('{_bound(lo)}') TO ('{_bound(hi)}'){options}"
                )
            )
        conn.execute(
            sa.text(f"CREATE TABLE {table}_default PARTITION OF {twin} DEFAULT{options}")
        )
    elif options:
        conn.execute(sa.text(f"ALTER TABLE {twin} SET ({options.removeprefix(' WITH (')}"))
    conn.execute(sa.text(f"INSERT INTO {twin} SELECT * FROM {table}"))

    constraints = conn.execute(
        sa.text(
            "SELECT conname, contype::text, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = CAST(:t AS regclass) AND contype IN ('p', 'u', 'f') "
            "ORDER BY contype DESC, conname"
        ),
        {"t": table},
    ).all()
    for name, kind, definition in constraints:
        if kind == "p":
            definition = (_PK_PARTITIONED if partitioned else _PK_PLAIN).get(table, definition)
        # Index-backed names are schema-wide: a temporary one until the old table is gone.
        new_name = name if kind == "f" else f"{name}__new"
        conn.execute(sa.text(f"ALTER TABLE {twin} ADD CONSTRAINT {new_name} {definition}"))
    indexes = conn.execute(
        sa.text(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = CAST(:t AS regclass) "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)"
        ),
        {"t": table},
    ).all()
    for name, definition in indexes:
        renamed = re.sub(r"^(CREATE (?:UNIQUE )?INDEX )\S+", rf"\g<1>{name}__new", definition)
        renamed = re.sub(r" ON (?:ONLY )?\S+ USING ", f" ON {schema}.{twin} USING ", renamed)
        conn.execute(sa.text(renamed))
    grants = conn.execute(
        sa.text(
            "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END, "
            "a.privilege_type FROM pg_class c, aclexplode(c.relacl) a "
            "LEFT JOIN pg_roles r ON r.oid = a.grantee "
            "WHERE c.oid = CAST(:t AS regclass) AND a.grantee <> c.relowner"
        ),
        {"t": table},
    ).all()
    for grantee, privilege in grants:
        conn.execute(sa.text(f"GRANT {privilege} ON {twin} TO {grantee}"))
    owner = conn.execute(
        sa.text(
            "SELECT quote_ident(pg_get_userbyid(relowner)) FROM pg_class "
            "WHERE oid = CAST(:t AS regclass)"
        ),
        {"t": table},
    ).scalar_one()
    conn.execute(sa.text(f"ALTER TABLE {twin} OWNER TO {owner}"))
    conn.execute(sa.text(f"ANALYZE {twin}"))


def _swap(conn: sa.Connection, table: str) -> None:
    twin = f"{table}__part"
    conn.execute(sa.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
    sequences = conn.execute(
        sa.text(
            "SELECT a.attname, pg_get_serial_sequence(:t, a.attname) FROM pg_attribute a "
            "WHERE a.attrelid = CAST(:t AS regclass) AND a.attnum > 0 AND NOT a.attisdropped "
            "AND pg_get_serial_sequence(:t, a.attname) IS NOT NULL"
        ),
        {"t": table},
    ).all()
    for column, sequence in sequences:  # events.event_id: the same sequence, same next id
        conn.execute(sa.text(f"ALTER SEQUENCE {sequence} OWNED BY {twin}.{column}"))
    conn.execute(sa.text(f"DROP TABLE {table}"))
    conn.execute(sa.text(f"ALTER TABLE {twin} RENAME TO {table}"))
    temporary = conn.execute(
        sa.text(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = CAST(:t AS regclass) AND c.relname LIKE '%\\_\\_new'"
        ),
        {"t": table},
    ).all()
    for (name,) in temporary:
        # Renaming a constraint's index renames the constraint with it.
        conn.execute(sa.text(f"ALTER INDEX {name} RENAME TO {name.removesuffix('__new')}"))


def _convert(*, partitioned: bool) -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return  # SQLite keeps plain tables (docs/adr/0036-time-partitions.md)
    now = conn.execute(sa.text("SELECT now()")).scalar_one()
    for table in TABLES:
        _build_twin(conn, table, partitioned=partitioned, now=now)
    for table in TABLES:
        _swap(conn, table)


def upgrade() -> None:
    """Apply this revision."""
    _convert(partitioned=True)


def downgrade() -> None:
    """Revert this revision (plain tables, every row kept)."""
    _convert(partitioned=False)
