"""Tenant-leading keys, first slice (docs/adr/0034-tenant-leading-keys.md).

The primary keys of ``batches``, ``batch_items``, ``inbound_events``,
``webhook_endpoints``, ``webhook_deliveries`` and ``webhook_attempts`` lead with
``tenant_id``; ``batch_items`` and ``webhook_attempts`` gain ``tenant_id`` (backfilled
from their parent, NOT NULL after) and their foreign keys become composite
``(tenant_id, parent_id)`` with the same ``ON DELETE CASCADE``. The indexes made
redundant by the new primary keys are dropped.

SQLite rebuilds a table to change its primary key (alembic batch mode). With
``foreign_keys=ON`` (app/db/database.py) dropping a parent during its rebuild is an
implicit ``DELETE`` that would cascade into its children, and the pragma cannot change
inside the migration's transaction; so on SQLite the children's rows are stashed in a
temporary table first and put back (with their parent's tenant) once both are rebuilt.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02 11:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (child, parent, parent key, child columns other than tenant_id, child key after parent key)
_CHILDREN = (
    ("batch_items", "batches", "batch_id", ("batch_id", "run_id", "outcome"), "run_id"),
    (
        "webhook_attempts",
        "webhook_deliveries",
        "delivery_id",
        ("delivery_id", "attempt", "started_at", "finished_at", "http_status", "error"),
        "attempt",
    ),
)
# (table, its id column, the index the tenant-leading primary key makes redundant)
_PARENTS = (
    ("batches", "batch_id", "ix_batches_tenant_id_batch_id"),
    ("inbound_events", "event_id", "ix_inbound_events_tenant_id_event_id"),
    ("webhook_endpoints", "endpoint_id", "ix_webhook_endpoints_tenant_id_endpoint_id"),
    ("webhook_deliveries", "delivery_id", None),
)


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _stash_children() -> None:
    # SQLite only: keep the children's rows out of reach of the parents' rebuild.
    for child, *_ in _CHILDREN:
        op.execute(f"CREATE TEMP TABLE _keep_{child} AS SELECT * FROM {child}")
        op.execute(f"DELETE FROM {child}")


def _restore_children(*, with_tenant: bool) -> None:
    for child, parent, key, cols, _ in _CHILDREN:
        names = ", ".join(cols)
        picked = ", ".join(f"k.{c}" for c in cols)
        if with_tenant:
            op.execute(
                f"INSERT INTO {child} (tenant_id, {names}) SELECT p.tenant_id, {picked} "
                f"FROM _keep_{child} k JOIN {parent} p ON p.{key} = k.{key}"
            )
        else:
            op.execute(f"INSERT INTO {child} ({names}) SELECT {picked} FROM _keep_{child} k")
        op.execute(f"DROP TABLE _keep_{child}")


def upgrade() -> None:
    """Apply this revision."""
    sqlite = _sqlite()
    if sqlite:
        _stash_children()
    for child, parent, key, _, _ in _CHILDREN:
        with op.batch_alter_table(child) as batch:
            batch.add_column(sa.Column("tenant_id", sa.String(128), nullable=True))
            batch.drop_constraint(f"fk_{child}_{key}_{parent}", type_="foreignkey")
        if not sqlite:
            # One pass joining the parent on its (still unique) id; the parent's row is
            # there for every child (the foreign key held until just now).
            op.execute(
                f"UPDATE {child} AS c SET tenant_id = p.tenant_id "
                f"FROM {parent} AS p WHERE p.{key} = c.{key}"
            )
    for table, key, redundant in _PARENTS:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"pk_{table}", type_="primary")
            batch.create_primary_key(f"pk_{table}", ["tenant_id", key])
            if redundant is not None:
                batch.drop_index(redundant)
    for child, parent, key, _, last in _CHILDREN:
        with op.batch_alter_table(child) as batch:
            batch.alter_column("tenant_id", existing_type=sa.String(128), nullable=False)
            batch.drop_constraint(f"pk_{child}", type_="primary")
            batch.create_primary_key(f"pk_{child}", ["tenant_id", key, last])
            batch.create_foreign_key(
                f"fk_{child}_tenant_id_{parent}",
                parent,
                ["tenant_id", key],
                ["tenant_id", key],
                ondelete="CASCADE",
            )
    if sqlite:
        _restore_children(with_tenant=True)


def downgrade() -> None:
    """Revert this revision."""
    sqlite = _sqlite()
    if sqlite:
        _stash_children()
    for child, parent, key, _, last in _CHILDREN:
        with op.batch_alter_table(child) as batch:
            batch.drop_constraint(f"fk_{child}_tenant_id_{parent}", type_="foreignkey")
            batch.drop_constraint(f"pk_{child}", type_="primary")
            batch.create_primary_key(f"pk_{child}", [key, last])
            batch.drop_column("tenant_id")
    for table, key, redundant in _PARENTS:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"pk_{table}", type_="primary")
            batch.create_primary_key(f"pk_{table}", [key])
            if redundant is not None:
                batch.create_index(redundant, ["tenant_id", key])
    for child, parent, key, _, _ in _CHILDREN:
        with op.batch_alter_table(child) as batch:
            batch.create_foreign_key(
                f"fk_{child}_{key}_{parent}", parent, [key], [key], ondelete="CASCADE"
            )
    if sqlite:
        _restore_children(with_tenant=False)
