"""Initial schema: definitions, workers, runs, steps (the journal), events, dead letters.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 19:41:36.537399
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.types


revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "runs",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("workflow", sa.String(length=200), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=True),
        sa.Column("input", sa.Text(), nullable=False),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("concurrency_key", sa.String(length=255), nullable=True),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("available_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("blocked_reason", sa.Text(), nullable=True),
        sa.Column("waiting_kind", sa.String(length=32), nullable=True),
        sa.Column("waiting_name", sa.String(length=200), nullable=True),
        sa.Column("waiting_deadline", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("parent_run_id", sa.Uuid(), nullable=True),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("updated_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("started_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("finished_at", app.db.types.UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
        sa.UniqueConstraint(
            "tenant_id",
            "idempotency_key",
            name=op.f("uq_runs_tenant_id_idempotency_key"),
        ),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_claimable",
            ["available_at"],
            unique=False,
            postgresql_where=sa.text("available_at IS NOT NULL"),
            sqlite_where=sa.text("available_at IS NOT NULL"),
        )
        batch_op.create_index(
            "ix_runs_lease_owner",
            ["lease_owner"],
            unique=False,
            postgresql_where=sa.text("lease_owner IS NOT NULL"),
            sqlite_where=sa.text("lease_owner IS NOT NULL"),
        )
        batch_op.create_index("ix_runs_tenant_id_run_id", ["tenant_id", "run_id"], unique=False)
        batch_op.create_index(
            "ix_runs_tenant_id_status_run_id",
            ["tenant_id", "status", "run_id"],
            unique=False,
        )
        batch_op.create_index(
            "ix_runs_tenant_id_workflow_run_id",
            ["tenant_id", "workflow", "run_id"],
            unique=False,
        )

    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("definitions", sa.Text(), nullable=False),
        sa.Column("started_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("last_heartbeat_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("stopped_at", app.db.types.UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_workers")),
    )
    op.create_table(
        "workflow_definitions",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("input_schema", sa.Text(), nullable=False),
        sa.Column("output_schema", sa.Text(), nullable=False),
        sa.Column("first_registered_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("last_registered_at", app.db.types.UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", "version", name=op.f("pk_workflow_definitions")),
    )
    op.create_table(
        "dead_letters",
        sa.Column("dead_letter_id", sa.Uuid(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("workflow", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("created_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("requeued_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("requeued_by", sa.String(length=255), nullable=True),
        sa.Column("requeue_reason", sa.Text(), nullable=True),
        sa.Column("correlation_id", sa.String(length=255), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_dead_letters_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("dead_letter_id", name=op.f("pk_dead_letters")),
    )
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.create_index("ix_dead_letters_run_id", ["run_id"], unique=False)
        batch_op.create_index(
            "ix_dead_letters_tenant_id_status", ["tenant_id", "status"], unique=False
        )

    op.create_table(
        "events",
        sa.Column(
            "event_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("step_id", sa.String(length=255), nullable=True),
        sa.Column("actor", sa.String(length=255), nullable=True),
        sa.Column("data", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_events_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_run_id_event_id", ["run_id", "event_id"], unique=False)

    op.create_table(
        "steps",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("step_id", sa.String(length=255), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("next_attempt_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("created_at", app.db.types.UtcDateTime(), nullable=False),
        sa.Column("started_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("finished_at", app.db.types.UtcDateTime(), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_steps_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "step_id", name=op.f("pk_steps")),
        sa.UniqueConstraint("run_id", "seq", name=op.f("uq_steps_run_id_seq")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("steps")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_run_id_event_id")

    op.drop_table("events")
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.drop_index("ix_dead_letters_tenant_id_status")
        batch_op.drop_index("ix_dead_letters_run_id")

    op.drop_table("dead_letters")
    op.drop_table("workflow_definitions")
    op.drop_table("workers")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_tenant_id_workflow_run_id")
        batch_op.drop_index("ix_runs_tenant_id_status_run_id")
        batch_op.drop_index("ix_runs_tenant_id_run_id")
        batch_op.drop_index(
            "ix_runs_lease_owner",
            postgresql_where=sa.text("lease_owner IS NOT NULL"),
            sqlite_where=sa.text("lease_owner IS NOT NULL"),
        )
        batch_op.drop_index(
            "ix_runs_claimable",
            postgresql_where=sa.text("available_at IS NOT NULL"),
            sqlite_where=sa.text("available_at IS NOT NULL"),
        )

    op.drop_table("runs")
