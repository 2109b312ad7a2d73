"""Durable cancel requests: ``runs.cancel_requested_at``.

Set by the first cancel request and never cleared, so a cancel survives a failed
compensation, a requeue, a retry and a resume: the run is undone and ends ``cancelled``
(or ``failed`` again), never ``completed`` (docs/adr/0009-requeue-into-compensation.md).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 11:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import UtcDateTime

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("cancel_requested_at", UtcDateTime(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("cancel_requested_at")
