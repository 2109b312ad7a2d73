"""Pause and rerun: who paused a run, when and why; the run a rerun started from.

``runs.paused_at`` / ``paused_by`` / ``pause_reason`` hold a pause
(docs/adr/0021-pause-is-a-flag-beside-the-status.md): a paused run is never claimed.
``runs.rerun_of`` / ``rerun_from_step`` link a rerun to its original
(docs/adr/0022-rerun-from-a-step.md).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 16:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import UtcDateTime

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("paused_at", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("paused_by", sa.String(255), nullable=True))
        batch.add_column(sa.Column("pause_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("rerun_of", sa.Uuid(), nullable=True))
        batch.add_column(sa.Column("rerun_from_step", sa.String(255), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("rerun_from_step")
        batch.drop_column("rerun_of")
        batch.drop_column("pause_reason")
        batch.drop_column("paused_by")
        batch.drop_column("paused_at")
