"""Run labels and the GET /runs filter indexes (docs/adr/0020-run-labels.md).

``runs.labels`` holds a run's labels as a JSON object (the copy run views return);
``run_labels`` holds one row per (run, key), indexed on (tenant_id, key, value, run_id)
for the ``label.<key>=`` equality and prefix filters. Label text is in the "C" collation
on PostgreSQL so a prefix is an index range. Five indexes on ``runs`` serve the
``reason``, ``version``, ``created_*``/``finished_*`` ranges and ``waiting_on`` filters.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 15:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = sa.String(64).with_variant(sa.String(64, collation="C"), "postgresql")
_VALUE = sa.String(256).with_variant(sa.String(256, collation="C"), "postgresql")


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("labels", sa.Text(), nullable=True))
    op.create_table(
        "run_labels",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("key", _KEY, nullable=False),
        sa.Column("value", _VALUE, nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_run_labels_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_run_labels")),
    )
    op.create_index(
        op.f("ix_run_labels_tenant_id_key_value_run_id"),
        "run_labels",
        ["tenant_id", "key", "value", "run_id"],
    )
    op.create_index(
        op.f("ix_runs_tenant_id_reason_run_id"), "runs", ["tenant_id", "reason", "run_id"]
    )
    op.create_index(
        op.f("ix_runs_tenant_id_version_run_id"), "runs", ["tenant_id", "version", "run_id"]
    )
    op.create_index(op.f("ix_runs_tenant_id_finished_at"), "runs", ["tenant_id", "finished_at"])
    op.create_index(op.f("ix_runs_tenant_id_created_at"), "runs", ["tenant_id", "created_at"])
    op.create_index(
        op.f("ix_runs_tenant_id_waiting_run_id"),
        "runs",
        ["tenant_id", "waiting_kind", "waiting_name", "run_id"],
        postgresql_where=sa.text("waiting_kind IS NOT NULL"),
        sqlite_where=sa.text("waiting_kind IS NOT NULL"),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_runs_tenant_id_waiting_run_id"), table_name="runs")
    op.drop_index(op.f("ix_runs_tenant_id_created_at"), table_name="runs")
    op.drop_index(op.f("ix_runs_tenant_id_finished_at"), table_name="runs")
    op.drop_index(op.f("ix_runs_tenant_id_version_run_id"), table_name="runs")
    op.drop_index(op.f("ix_runs_tenant_id_reason_run_id"), table_name="runs")
    op.drop_index(op.f("ix_run_labels_tenant_id_key_value_run_id"), table_name="run_labels")
    op.drop_table("run_labels")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("labels")
