"""Console sessions: one row per signed-in browser (docs/console.md).

``console_sessions`` keys a session by the SHA-256 of its cookie's random id and holds the
user's token encrypted under a key derived from that id and ``TREADLE_CONSOLE_SECRET``
(docs/adr/0017-console-architecture.md), with its CSRF token, a one-shot flash message
and its idle and absolute deadlines.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 15:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import UtcDateTime

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "console_sessions",
        sa.Column("id_hash", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("token_ciphertext", sa.Text(), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("flash", sa.Text(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("last_seen_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_console_sessions")),
    )
    op.create_index(
        op.f("ix_console_sessions_expires_at"), "console_sessions", ["expires_at"], unique=False
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_console_sessions_expires_at"), table_name="console_sessions")
    op.drop_table("console_sessions")
