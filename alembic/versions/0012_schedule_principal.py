"""Schedules carry the principal that created them: API key and access policy.

``schedules.api_key_id``: the API key the schedule was created with (NULL for a JWT), so
each fire re-checks it as a worker attempt re-checks a submitted run's, and the runs it
starts carry it. ``schedules.access``: ``tenant`` or ``owner``, the access policy of its
workflow, so an owner-policy workflow's schedule is its creator's alone.

Existing rows are backfilled conservatively: a schedule created by ``api-key:<prefix>``
is bound to that key (a revoked key's schedules stop firing), and one whose workflow has
any ``owner``-policy version it may start becomes ``owner``.

Revision ID: 0012
Revises: 0010
Create Date: 2026-12-01 11:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("api_key_id", sa.Uuid(), nullable=True))
        batch_op.add_column(
            sa.Column("access", sa.String(16), nullable=False, server_default=sa.text("'tenant'"))
        )
    op.execute(
        "UPDATE schedules SET api_key_id = (SELECT k.key_id FROM api_keys k "
        "WHERE 'api-key:' || k.prefix = schedules.created_by AND k.tenant_id = schedules.tenant_id)"
    )
    op.execute(
        "UPDATE schedules SET access = 'owner' WHERE EXISTS (SELECT 1 FROM workflow_definitions d "
        "WHERE d.name = schedules.workflow AND d.access = 'owner' "
        "AND (schedules.version IS NULL OR d.version = schedules.version))"
    )


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_column("access")
        batch_op.drop_column("api_key_id")
