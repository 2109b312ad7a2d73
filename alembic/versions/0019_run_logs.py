"""Lines handler code logs with ``ctx.logger``, kept with the run (docs/adr/0027-run-logs.md).

``run_logs``: one row per kept line (``seq`` 1.. per run, bounded by
``TREADLE_RUN_LOG_MAX_LINES``), plus at most one "N lines dropped" summary per run.
``(run_id, origin)`` is unique so a replayed line is never appended twice.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01 18:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from app.db.types import UtcDateTime

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "run_logs",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True
        ),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("origin", sa.String(300), nullable=False),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("fields", sa.Text(), nullable=True),
        sa.Column("step_id", sa.String(255), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.run_id"], name=op.f("fk_run_logs_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_logs")),
        sa.UniqueConstraint("run_id", "seq", name=op.f("uq_run_logs_run_id_seq")),
        sa.UniqueConstraint("run_id", "origin", name=op.f("uq_run_logs_run_id_origin")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("run_logs")
