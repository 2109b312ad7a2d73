"""Waits: signals (buffered, consumed once), approval decisions, step deadlines.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 20:21:19.939869
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types


revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "approval_decisions",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("step_id", sa.String(length=255), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("decided_by", sa.String(length=255), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("payload", sa.Text(), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("decided_at", app.db.types.UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_approval_decisions_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "run_id", "step_id", "decided_by", name=op.f("pk_approval_decisions")
        ),
    )
    op.create_table(
        "signals",
        sa.Column(
            "signal_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("payload", sa.Text(), nullable=True),
        sa.Column("sent_by", sa.String(length=255), nullable=False),
        sa.Column("received_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("consumed_step_id", sa.String(length=255), nullable=True),
        sa.Column("consumed_at", app.db.types.UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_signals_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("signal_id", name=op.f("pk_signals")),
    )
    with op.batch_alter_table("signals", schema=None) as batch_op:
        batch_op.create_index(
            "ix_signals_run_id_name_signal_id", ["run_id", "name", "signal_id"], unique=False
        )

    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deadline", app.db.types.UtcDateTime(), nullable=True))
        batch_op.add_column(sa.Column("detail", sa.Text(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_column("detail")
        batch_op.drop_column("deadline")

    with op.batch_alter_table("signals", schema=None) as batch_op:
        batch_op.drop_index("ix_signals_run_id_name_signal_id")

    op.drop_table("signals")
    op.drop_table("approval_decisions")
