"""The read replica's heartbeat row (docs/adr/0049-replica-lag-from-a-heartbeat.md, 0028).

``replica_heartbeat`` holds one row (``id`` 1, a check constraint says so) whose
``beat_at`` an API process with ``TREADLE_READ_DATABASE_URL`` set moves to the primary's
``now()`` about every second (``app/db/replica.py``). A standby's copy of it shows how far
behind the standby may be: its age grows while replay is paused or slow and while the
standby is cut off from the primary, which replay positions alone cannot tell from an
idle primary. The row is written on the first beat, so the table starts empty; creating
it is a catalog change on both databases.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-08 01:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from app.db.types import UtcDateTime

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``replica_heartbeat`` (id integer primary key, 1 only; beat_at timestamp)."""
    op.create_table(
        "replica_heartbeat",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("beat_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replica_heartbeat")),
        sa.CheckConstraint("id = 1", name=op.f("ck_replica_heartbeat_single_row")),
    )


def downgrade() -> None:
    """Drop ``replica_heartbeat``."""
    op.drop_table("replica_heartbeat")
