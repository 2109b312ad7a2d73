"""Maintenance: ``runs.compacted_at``, an index on finished runs, and ``runs_archive``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 22:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types


revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "runs_archive",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("workflow", sa.String(length=200), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=True),
        sa.Column("input", sa.Text(), nullable=False),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("parent_run_id", sa.Uuid(), nullable=True),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("started_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("finished_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("compacted_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("archived_at", app.db.types.UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs_archive")),
    )
    with op.batch_alter_table("runs_archive", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_archive_tenant_id_run_id", ["tenant_id", "run_id"], unique=False
        )

    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("compacted_at", app.db.types.UtcDateTime(), nullable=True))
        batch_op.create_index(
            "ix_runs_finished_at_run_id",
            ["finished_at", "run_id"],
            unique=False,
            postgresql_where=sa.text("finished_at IS NOT NULL"),
            sqlite_where=sa.text("finished_at IS NOT NULL"),
        )


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_runs_finished_at_run_id",
            postgresql_where=sa.text("finished_at IS NOT NULL"),
            sqlite_where=sa.text("finished_at IS NOT NULL"),
        )
        batch_op.drop_column("compacted_at")

    with op.batch_alter_table("runs_archive", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_archive_tenant_id_run_id")

    op.drop_table("runs_archive")
