"""Schedules: cron and one-off schedules, and one row per fired tick.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 22:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "schedules",
        sa.Column("schedule_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("workflow", sa.String(length=200), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=True),
        sa.Column("input", sa.Text(), nullable=False),
        sa.Column("cron", sa.String(length=255), nullable=True),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("overlap", sa.String(length=32), nullable=False),
        sa.Column("catchup_window_seconds", sa.Integer(), nullable=False),
        sa.Column("jitter_seconds", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("next_tick_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("next_fire_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("last_tick_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("buffered_tick_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("fired_count", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("missed_count", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("skipped_count", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("updated_at", app.db.types.UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("schedule_id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_schedules_tenant_id_name")),
    )
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.create_index(
            "ix_schedules_due",
            ["next_fire_at"],
            unique=False,
            postgresql_where=sa.text("state = 'active'"),
            sqlite_where=sa.text("state = 'active'"),
        )
        batch_op.create_index(
            "ix_schedules_tenant_id_schedule_id", ["tenant_id", "schedule_id"], unique=False
        )
    op.create_table(
        "schedule_fires",
        sa.Column("schedule_id", sa.Uuid(), nullable=False),
        sa.Column("tick", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=True),
        sa.Column("fired_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("fired_by", sa.String(length=255), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.schedule_id"],
            name=op.f("fk_schedule_fires_schedule_id_schedules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("schedule_id", "tick", name=op.f("pk_schedule_fires")),
    )
    with op.batch_alter_table("schedule_fires", schema=None) as batch_op:
        batch_op.create_index("ix_schedule_fires_run_id", ["run_id"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("schedule_fires", schema=None) as batch_op:
        batch_op.drop_index("ix_schedule_fires_run_id")
    op.drop_table("schedule_fires")
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_index("ix_schedules_tenant_id_schedule_id")
        batch_op.drop_index("ix_schedules_due")
    op.drop_table("schedules")
