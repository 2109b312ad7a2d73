"""Durable batches of bulk run actions (docs/adr/0023-durable-batches.md).

``batches``: one bulk action (cancel, retry, resume, signal, pause, unpause) with its
progress counters, a keyset cursor on run_id and a worker lease with a fence.
``batch_items``: the runs it acts on, fixed at creation, with each one's outcome.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 16:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from app.db.types import UtcDateTime

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "batches",
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("selection", sa.Text(), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("matched", sa.BigInteger(), nullable=False),
        sa.Column("done", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("skipped", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("failed", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("skipped_reasons", sa.Text(), server_default=sa.text("'{}'"), nullable=False),
        sa.Column("failures", sa.Text(), server_default=sa.text("'[]'"), nullable=False),
        sa.Column("cursor", sa.Uuid(), nullable=True),
        sa.Column("lease_owner", sa.String(255), nullable=True),
        sa.Column("lease_until", UtcDateTime(), nullable=True),
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_batches")),
    )
    op.create_index("ix_batches_tenant_id_batch_id", "batches", ["tenant_id", "batch_id"])
    op.create_index(
        "ix_batches_running",
        "batches",
        ["lease_until"],
        postgresql_where=sa.text("state = 'running'"),
        sqlite_where=sa.text("state = 'running'"),
    )
    op.create_table(
        "batch_items",
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("outcome", sa.String(64), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["batches.batch_id"],
            name=op.f("fk_batch_items_batch_id_batches"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("batch_id", "run_id", name=op.f("pk_batch_items")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("batch_items")
    op.drop_index("ix_batches_running", table_name="batches")
    op.drop_index("ix_batches_tenant_id_batch_id", table_name="batches")
    op.drop_table("batches")
