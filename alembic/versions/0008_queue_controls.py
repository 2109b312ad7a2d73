"""Queue controls registered with each workflow definition.

``workflow_definitions.queue_controls``: the JSON of ``QueueControls.to_json()`` (per-key
limit and ``on_limit``, global concurrency limit, rate limit), so the API can enforce and
show them without importing handler code. NULL for definitions registered before: the
defaults (one active run per key, reject).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 02:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("workflow_definitions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue_controls", sa.Text(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("workflow_definitions", schema=None) as batch_op:
        batch_op.drop_column("queue_controls")
