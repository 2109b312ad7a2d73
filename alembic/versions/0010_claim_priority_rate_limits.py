"""Claim order by priority, and rate-limit buckets.

``ix_runs_claimable`` becomes ``(priority DESC, available_at)`` so a claim walks due runs
highest priority first and stops after its LIMIT, instead of sorting every due run; and
``rate_limit_buckets`` holds one GCRA theoretical arrival time per rate-limited workflow
(or workflow and concurrency key).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30 02:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import UtcDateTime

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CLAIMABLE = sa.text("available_at IS NOT NULL")


def upgrade() -> None:
    """Apply this revision."""
    op.drop_index("ix_runs_claimable", table_name="runs")
    op.create_index(
        "ix_runs_claimable",
        "runs",
        [sa.text("priority DESC"), "available_at"],
        postgresql_where=_CLAIMABLE,
        sqlite_where=_CLAIMABLE,
    )
    op.create_table(
        "rate_limit_buckets",
        sa.Column("workflow", sa.String(200), nullable=False),
        sa.Column("bucket", sa.String(400), nullable=False),
        sa.Column("tat", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("workflow", "bucket", name=op.f("pk_rate_limit_buckets")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("rate_limit_buckets")
    op.drop_index("ix_runs_claimable", table_name="runs")
    op.create_index(
        "ix_runs_claimable",
        "runs",
        ["available_at"],
        postgresql_where=_CLAIMABLE,
        sqlite_where=_CLAIMABLE,
    )
