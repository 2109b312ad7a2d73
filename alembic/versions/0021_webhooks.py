"""Outbound webhooks (docs/adr/0030-outbound-webhooks.md).

``webhook_endpoints``: a tenant's targets (URL, terminal statuses, workflow filter,
signing secret). ``webhook_deliveries``: one row per terminal state of a run and matching
endpoint, written in the terminal write's transaction, sent by workers. ``webhook_attempts``:
each POST of a delivery.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01 22:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from app.db.types import UtcDateTime

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "webhook_endpoints",
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("events", sa.String(200), nullable=False),
        sa.Column("workflow", sa.String(200), nullable=True),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("endpoint_id", name=op.f("pk_webhook_endpoints")),
    )
    op.create_index(
        op.f("ix_webhook_endpoints_tenant_id_endpoint_id"),
        "webhook_endpoints",
        ["tenant_id", "endpoint_id"],
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("delivery_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("workflow", sa.String(200), nullable=False),
        sa.Column("run_status", sa.String(32), nullable=False),
        sa.Column("run_reason", sa.String(64), nullable=True),
        sa.Column("finished_at", UtcDateTime(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", UtcDateTime(), nullable=True),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("delivery_id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(
        op.f("ix_webhook_deliveries_endpoint_id_created_at_delivery_id"),
        "webhook_deliveries",
        ["endpoint_id", "created_at", "delivery_id"],
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("state = 'pending'"),
        sqlite_where=sa.text("state = 'pending'"),
    )
    op.create_table(
        "webhook_attempts",
        sa.Column("delivery_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["webhook_deliveries.delivery_id"],
            name=op.f("fk_webhook_attempts_delivery_id_webhook_deliveries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("delivery_id", "attempt", name=op.f("pk_webhook_attempts")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_index(
        op.f("ix_webhook_deliveries_endpoint_id_created_at_delivery_id"), table_name="webhook_deliveries"
    )
    op.drop_table("webhook_deliveries")
    op.drop_index(
        op.f("ix_webhook_endpoints_tenant_id_endpoint_id"), table_name="webhook_endpoints"
    )
    op.drop_table("webhook_endpoints")
