"""Concurrency keys and state-machine states.

At most one active (non-terminal) run per (tenant, workflow, concurrency key), enforced by
a partial unique index so admission is atomic on PostgreSQL and SQLite alike; and the
``states`` a state-machine definition registers (JSON text, NULL for other kinds).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 23:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Must match ACTIVE_CONCURRENCY_KEY_WHERE in app/db/tables.py.
_ACTIVE = (
    "concurrency_key IS NOT NULL AND status NOT IN "
    "('completed', 'failed', 'cancelled', 'compensated')"
)


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "uq_runs_active_concurrency_key",
            ["tenant_id", "workflow", "concurrency_key"],
            unique=True,
            postgresql_where=sa.text(_ACTIVE),
            sqlite_where=sa.text(_ACTIVE),
        )
    with op.batch_alter_table("workflow_definitions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("states", sa.Text(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("workflow_definitions", schema=None) as batch_op:
        batch_op.drop_column("states")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("uq_runs_active_concurrency_key")
