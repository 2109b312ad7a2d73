"""The W3C trace context a run was submitted under (docs/adr/0026-traces-as-an-optional-extra.md).

``runs.trace_parent`` / ``trace_state`` hold the ``traceparent`` and ``tracestate`` header
values of the span that submitted the run (the API's ``POST /runs`` span, or the client's
own when the API does not trace): every execution of the run is traced as its child, so
the run is one trace across the queue, workers and crashes. Both NULL: no context.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 18:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("trace_parent", sa.String(55), nullable=True))
        batch.add_column(sa.Column("trace_state", sa.String(512), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("trace_state")
        batch.drop_column("trace_parent")
