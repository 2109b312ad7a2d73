"""Count a run's lost claims (docs/adr/0040-one-commit-per-step.md, revision 0025).

``runs.lost_claims`` counts the claims in a row that ended with the lease lost (the
worker killed, crashed or cut off) before the run journaled any step progress: a claim
that finds the lease still held by a worker (``lease_owner`` set, the lease expired) adds
one; a step write resets it to 0. It stands in for the ``running`` start record a fast
step no longer writes, so an attempt cut short by a lost worker is still counted against
``TREADLE_MAX_LOST_ATTEMPTS``.

Adding a column with a constant default is a catalog change on PostgreSQL (no table
rewrite) and an ``ALTER TABLE … ADD COLUMN`` on SQLite: safe on a populated database.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02 17:55:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``runs.lost_claims`` (integer, not null, default 0)."""
    op.add_column(
        "runs",
        sa.Column("lost_claims", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    """Drop ``runs.lost_claims``."""
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lost_claims")
