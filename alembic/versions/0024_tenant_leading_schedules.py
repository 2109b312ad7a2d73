"""Tenant-leading keys for schedules (docs/adr/0034-tenant-leading-keys.md, revision 0024).

The primary key of ``schedules`` becomes ``(tenant_id, schedule_id)`` (the index
``ix_schedules_tenant_id_schedule_id`` it makes redundant is dropped), that of
``schedule_fires`` ``(tenant_id, schedule_id, tick)``, and the fires' foreign key becomes
composite ``(tenant_id, schedule_id) -> schedules`` with the same ``ON DELETE CASCADE``.
``ix_schedule_fires_run_id`` becomes ``ix_schedule_fires_tenant_id_run_id``. The due index
``ix_schedules_due`` stays global (the scheduler loop scans every tenant), and a partial
index ``ix_schedules_buffered`` serves the loop's other scan, for ``buffer_one`` ticks
held back, which read the whole table before.

``schedule_fires`` has had ``tenant_id`` since revision 0004, written from its schedule;
it is set from the schedule again here, so the composite foreign key holds even for a row
someone edited by hand (the schedule's id was the key that linked them).

SQLite rebuilds a table to change its primary key (alembic batch mode). With
``foreign_keys=ON`` (app/db/database.py, and the pragma cannot change inside the
migration's transaction) dropping ``schedules`` during its rebuild is an implicit
``DELETE`` that cascades into any table whose foreign key still points at it. The fires'
foreign key is dropped before ``schedules`` is rebuilt, and the fires are stashed in a
temporary table besides, as revision 0022 does for its children: no order of the steps
can then reach them, and they are put back with their schedule's tenant (SQLite's share
of the backfill PostgreSQL does with ``UPDATE … FROM``). The rebuild keeps the partial
indexes' predicates (SQLAlchemy reflects ``sqlite_where``; the migration test checks it).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02 13:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FIRE_COLUMNS = (
    "schedule_id",
    "tick",
    "kind",
    "outcome",
    "run_id",
    "fired_at",
    "fired_by",
    "error",
)
_BUFFERED_WHERE = "state = 'active' AND buffered_tick_at IS NOT NULL"


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _stash_fires() -> None:
    # SQLite only: keep the fires out of reach of the schedules' rebuild.
    op.execute("CREATE TEMP TABLE _keep_schedule_fires AS SELECT * FROM schedule_fires")
    op.execute("DELETE FROM schedule_fires")


def _restore_fires() -> None:
    names = ", ".join(_FIRE_COLUMNS)
    picked = ", ".join(f"k.{c}" for c in _FIRE_COLUMNS)
    # The schedule's tenant, whatever the stashed row said (see the module docstring).
    op.execute(
        f"INSERT INTO schedule_fires (tenant_id, {names}) SELECT s.tenant_id, {picked} "
        "FROM _keep_schedule_fires k JOIN schedules s ON s.schedule_id = k.schedule_id"
    )
    op.execute("DROP TABLE _keep_schedule_fires")


def upgrade() -> None:
    """Apply this revision."""
    sqlite = _sqlite()
    if sqlite:
        _stash_fires()
    with op.batch_alter_table("schedule_fires") as batch:
        batch.drop_constraint("fk_schedule_fires_schedule_id_schedules", type_="foreignkey")
    if not sqlite:
        # One pass joining the schedule on its (still unique) id; only rows that disagree
        # are written (none, unless edited by hand).
        op.execute(
            "UPDATE schedule_fires AS f SET tenant_id = s.tenant_id FROM schedules AS s "
            "WHERE s.schedule_id = f.schedule_id AND f.tenant_id <> s.tenant_id"
        )
    with op.batch_alter_table("schedules") as batch:
        batch.drop_constraint("pk_schedules", type_="primary")
        batch.create_primary_key("pk_schedules", ["tenant_id", "schedule_id"])
        batch.drop_index("ix_schedules_tenant_id_schedule_id")
    op.create_index(
        "ix_schedules_buffered",
        "schedules",
        ["tenant_id", "schedule_id"],
        postgresql_where=sa.text(_BUFFERED_WHERE),
        sqlite_where=sa.text(_BUFFERED_WHERE),
    )
    with op.batch_alter_table("schedule_fires") as batch:
        batch.drop_constraint("pk_schedule_fires", type_="primary")
        batch.create_primary_key("pk_schedule_fires", ["tenant_id", "schedule_id", "tick"])
        batch.create_foreign_key(
            "fk_schedule_fires_tenant_id_schedules",
            "schedules",
            ["tenant_id", "schedule_id"],
            ["tenant_id", "schedule_id"],
            ondelete="CASCADE",
        )
        batch.drop_index("ix_schedule_fires_run_id")
        batch.create_index("ix_schedule_fires_tenant_id_run_id", ["tenant_id", "run_id"])
    if sqlite:
        _restore_fires()


def downgrade() -> None:
    """Revert this revision."""
    sqlite = _sqlite()
    if sqlite:
        _stash_fires()
    with op.batch_alter_table("schedule_fires") as batch:
        batch.drop_constraint("fk_schedule_fires_tenant_id_schedules", type_="foreignkey")
        batch.drop_constraint("pk_schedule_fires", type_="primary")
        batch.create_primary_key("pk_schedule_fires", ["schedule_id", "tick"])
        batch.drop_index("ix_schedule_fires_tenant_id_run_id")
        batch.create_index("ix_schedule_fires_run_id", ["run_id"])
    op.drop_index("ix_schedules_buffered", table_name="schedules")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_constraint("pk_schedules", type_="primary")
        batch.create_primary_key("pk_schedules", ["schedule_id"])
        batch.create_index("ix_schedules_tenant_id_schedule_id", ["tenant_id", "schedule_id"])
    with op.batch_alter_table("schedule_fires") as batch:
        batch.create_foreign_key(
            "fk_schedule_fires_schedule_id_schedules",
            "schedules",
            ["schedule_id"],
            ["schedule_id"],
            ondelete="CASCADE",
        )
    if sqlite:
        _restore_fires()
