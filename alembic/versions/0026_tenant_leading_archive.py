"""Tenant-leading key for the run archive (docs/adr/0034-tenant-leading-keys.md, revision 0026).

The primary key of ``runs_archive`` becomes ``(tenant_id, run_id)``; the index
``ix_runs_archive_tenant_id_run_id`` on the same columns, which it makes redundant, is
dropped. Nothing refers to ``runs_archive`` by foreign key, and every archived row already
has its run's tenant (copied at archival, NOT NULL since revision 0005), so no row is
written: the key is the old one with a column in front whose value never changes.

On PostgreSQL ``runs_archive`` is ``PARTITION BY RANGE (run_id)`` (revision 0023); the new
key contains the partition key, as it must, and ``ALTER TABLE`` on the partitioned table
rebuilds it in every partition (default included) in this transaction. SQLite rebuilds the
table (alembic batch mode); no foreign key points at it, so the rebuild cascades nowhere.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-02 18:20:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("runs_archive") as batch:
        batch.drop_constraint("pk_runs_archive", type_="primary")
        batch.create_primary_key("pk_runs_archive", ["tenant_id", "run_id"])
        batch.drop_index("ix_runs_archive_tenant_id_run_id")


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("runs_archive") as batch:
        batch.drop_constraint("pk_runs_archive", type_="primary")
        batch.create_primary_key("pk_runs_archive", ["run_id"])
        batch.create_index("ix_runs_archive_tenant_id_run_id", ["tenant_id", "run_id"])
