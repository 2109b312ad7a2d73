"""Principals of deferred actions: a batch's scopes and API key, an event's sender policy.

``batches.scopes`` (JSON text list) and ``batches.api_key_id`` record the creator's scopes
and API key, so the batch runner re-checks each item as the single action would
(docs/adr/0052-bulk-actions-under-their-creators-principal.md). Batches created before
this revision have no recorded scopes: their remaining items fail ``forbidden`` (create
them again).

``inbound_events.sent_by_admin`` is 1 when the sender held ``admin`` (who may reach every
run, as with a signal). An event reaches an ``access="owner"`` run only from its owner
(``sent_by``) or an admin, at the post and by a wait's look-back (docs/security.md).
Events posted before this revision, and by API processes of the previous release until
they restart, get 0: the stricter reading (only their sender's own private runs).

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-08 01:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("scopes", sa.Text(), nullable=True))
        batch.add_column(sa.Column("api_key_id", sa.Uuid(), nullable=True))
    with op.batch_alter_table("inbound_events") as batch:
        batch.add_column(
            sa.Column("sent_by_admin", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("inbound_events") as batch:
        batch.drop_column("sent_by_admin")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("api_key_id")
        batch.drop_column("scopes")
