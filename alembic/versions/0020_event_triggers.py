"""Event triggers and waits for events (docs/adr/0029-event-triggers.md).

``workflow_definitions`` gains ``on_event`` and ``event_filter`` (a definition started by
``POST /events``); ``inbound_events`` keeps every posted event (idempotent per tenant by
``key``); ``event_waits`` is the mailbox of each ``ctx.wait_for_event``.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01 22:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from app.db.types import UtcDateTime

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("workflow_definitions") as batch:
        batch.add_column(sa.Column("on_event", sa.String(200), nullable=True))
        batch.add_column(sa.Column("event_filter", sa.Text(), nullable=True))
        batch.create_index("ix_workflow_definitions_on_event", ["on_event"])
    op.create_table(
        "inbound_events",
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("key", sa.String(255), nullable=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("sent_by", sa.String(255), nullable=False),
        sa.Column("received_at", UtcDateTime(), nullable=False),
        sa.Column("started_run_ids", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_inbound_events")),
        sa.UniqueConstraint("tenant_id", "key", name=op.f("uq_inbound_events_tenant_id_key")),
    )
    op.create_index(
        "ix_inbound_events_tenant_id_name_event_id",
        "inbound_events",
        ["tenant_id", "name", "event_id"],
    )
    op.create_index(
        "ix_inbound_events_tenant_id_event_id", "inbound_events", ["tenant_id", "event_id"]
    )
    op.create_table(
        "event_waits",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("step_id", sa.String(255), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("match", sa.Text(), nullable=False),
        sa.Column("since", UtcDateTime(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("event_id", sa.Uuid(), nullable=True),
        sa.Column("delivered_at", UtcDateTime(), nullable=True),
        sa.CheckConstraint(
            "status IN ('waiting', 'delivered', 'timed_out')", name=op.f("ck_event_waits_status")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_event_waits_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "step_id", name=op.f("pk_event_waits")),
    )
    op.create_index(
        "ix_event_waits_tenant_id_name_status", "event_waits", ["tenant_id", "name", "status"]
    )
    op.create_index("ix_event_waits_event_id", "event_waits", ["event_id"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("event_waits")
    op.drop_table("inbound_events")
    with op.batch_alter_table("workflow_definitions") as batch:
        batch.drop_index("ix_workflow_definitions_on_event")
        batch.drop_column("event_filter")
        batch.drop_column("on_event")
