"""Tenants: an operator can suspend a tenant (and resume it).

Only tenants an operator acted on have a row; a tenant without one is active.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "tenants",
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("changed_by", sa.String(length=255), nullable=False),
        sa.Column("changed_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("created_at", app.db.types.UtcDateTime(), nullable=False),
        sa.CheckConstraint(
            "status IN ('active', 'suspended')", name=op.f("ck_tenants_status")
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_tenants")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("tenants")
