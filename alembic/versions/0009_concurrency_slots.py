"""Concurrency slots: up to ``key_limit`` active runs per key, and runs waiting for a slot.

``runs.concurrency_slot`` (1..N) replaces "one active run per key": the unique partial
index ``uq_runs_active_concurrency_slot`` on (tenant, workflow, key, slot) over
non-terminal runs replaces ``uq_runs_active_concurrency_key``. A keyed run without a slot
waits for one (``on_limit="queue"``), found through ``ix_runs_waiting_for_slot``;
``runs.not_before`` keeps the start time it asked for. Every active keyed run of the old
schema held its key alone, so it gets slot 1.

Downgrade restores one active run per key and refuses (``RuntimeError``) while a key has
more than one active run, which the old index cannot hold.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 04:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TERMINAL = "('completed', 'failed', 'cancelled', 'compensated')"
# Must match ACTIVE_CONCURRENCY_SLOT_WHERE and WAITING_FOR_SLOT_WHERE in app/db/tables.py.
_ACTIVE_SLOT = f"concurrency_slot IS NOT NULL AND status NOT IN {_TERMINAL}"
_WAITING = (
    f"concurrency_key IS NOT NULL AND concurrency_slot IS NULL AND status NOT IN {_TERMINAL}"
)
# As in revision 0006.
_ACTIVE_KEY = f"concurrency_key IS NOT NULL AND status NOT IN {_TERMINAL}"


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("concurrency_slot", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("not_before", app.db.types.UtcDateTime(), nullable=True))
    op.execute(f"UPDATE runs SET concurrency_slot = 1 WHERE {_ACTIVE_KEY}")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("uq_runs_active_concurrency_key")
        batch_op.create_index(
            "uq_runs_active_concurrency_slot",
            ["tenant_id", "workflow", "concurrency_key", "concurrency_slot"],
            unique=True,
            postgresql_where=sa.text(_ACTIVE_SLOT),
            sqlite_where=sa.text(_ACTIVE_SLOT),
        )
        batch_op.create_index(
            "ix_runs_waiting_for_slot",
            ["tenant_id", "workflow", "concurrency_key", "run_id"],
            unique=False,
            postgresql_where=sa.text(_WAITING),
            sqlite_where=sa.text(_WAITING),
        )


def downgrade() -> None:
    """Revert this revision."""
    crowded = (
        op.get_bind()
        .execute(
            sa.text(
                f"SELECT count(*) FROM (SELECT 1 FROM runs WHERE {_ACTIVE_KEY} "
                "GROUP BY tenant_id, workflow, concurrency_key HAVING count(*) > 1) AS k"
            )
        )
        .scalar_one()
    )
    if crowded:
        raise RuntimeError(
            f"cannot downgrade below 0009: {crowded} concurrency keys have more than one "
            "active run; let them finish or cancel them first"
        )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_waiting_for_slot")
        batch_op.drop_index("uq_runs_active_concurrency_slot")
        batch_op.create_index(
            "uq_runs_active_concurrency_key",
            ["tenant_id", "workflow", "concurrency_key"],
            unique=True,
            postgresql_where=sa.text(_ACTIVE_KEY),
            sqlite_where=sa.text(_ACTIVE_KEY),
        )
        batch_op.drop_column("not_before")
        batch_op.drop_column("concurrency_slot")
