"""API keys per tenant; runs remember their submitting key and access policy.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 22:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types


revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("revoked_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("revoked_by", sa.String(length=255), nullable=True),
        sa.Column("last_used_at", app.db.types.UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index("ix_api_keys_tenant_id_key_id", ["tenant_id", "key_id"], unique=False)

    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("api_key_id", sa.Uuid(), nullable=True))
        batch_op.add_column(
            sa.Column(
                "access", sa.String(length=16), server_default=sa.text("'tenant'"), nullable=False
            )
        )

    with op.batch_alter_table("workflow_definitions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "access", sa.String(length=16), server_default=sa.text("'tenant'"), nullable=False
            )
        )


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("workflow_definitions", schema=None) as batch_op:
        batch_op.drop_column("access")

    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("access")
        batch_op.drop_column("api_key_id")

    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_api_keys_tenant_id_key_id")

    op.drop_table("api_keys")
