"""Principals of deferred actions: a batch's scopes and API key, an event's sender policy.

``batches.scopes`` (JSON text list) and ``batches.api_key_id`` record the creator's scopes
and API key, so the batch runner re-checks each item as the single action would
(docs/adr/0049-bulk-actions-under-their-creators-principal.md). Batches created before
this revision have no recorded scopes: their remaining items fail ``forbidden`` (create
them again).

``inbound_events.owner`` is the sender's owner filter: its subject, or NULL for an
``admin`` sender (who may reach every run, as with a signal). A wait's look-back takes an
event into an ``access="owner"`` run only from its owner or an admin (docs/security.md).
Events posted before this revision get their sender's subject (the stricter reading).

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-08 01:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("scopes", sa.Text(), nullable=True))
        batch.add_column(sa.Column("api_key_id", sa.Uuid(), nullable=True))
    with op.batch_alter_table("inbound_events") as batch:
        batch.add_column(sa.Column("owner", sa.String(255), nullable=True))
    op.execute("UPDATE inbound_events SET owner = sent_by")


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("inbound_events") as batch:
        batch.drop_column("owner")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("api_key_id")
        batch.drop_column("scopes")
