"""Workflow definitions carry a DAG's graph: its nodes and the nodes each one follows.

``workflow_definitions.graph``: JSON list ``[{"name": node, "after": [parent, …]}, …]`` in
execution order (level by level), written by the worker that registers a DAG so the API
and the console can draw it without importing handler code; NULL for other kinds and for
DAGs registered before this revision (filled in at their next registration).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 15:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("workflow_definitions") as batch:
        batch.add_column(sa.Column("graph", sa.Text(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("workflow_definitions") as batch:
        batch.drop_column("graph")
