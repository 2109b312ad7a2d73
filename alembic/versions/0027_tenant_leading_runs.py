"""Tenant-leading keys for runs and its children (docs/adr/0034-tenant-leading-keys.md, 0027).

``runs``' primary key becomes ``(tenant_id, run_id)``, with no ``UNIQUE (run_id)`` beside
it (run ids are UUIDv7s, unique by construction); ``ix_runs_tenant_id_run_id``, which it
makes redundant, is dropped, and a non-unique ``ix_runs_run_id`` keeps the statements
that still find a run by id alone (the claim's update, the lease renewal, operator paths)
index lookups: the index set of ``runs`` keeps its columns, only the uniqueness moves.
Every table with a foreign key to ``runs(run_id)`` gets the composite ``(tenant_id,
run_id) -> runs(tenant_id, run_id)`` with the same ``ON DELETE CASCADE``, and
tenant-leading keys:

- ``run_labels`` (tenant_id, run_id, key); ``steps`` (tenant_id, run_id, step_id) and
  ``UNIQUE (tenant_id, run_id, seq)``; ``approval_decisions`` (tenant_id, run_id,
  step_id, decided_by); ``event_waits`` (tenant_id, run_id, step_id); ``dead_letters``
  (tenant_id, dead_letter_id).
- ``events``, ``signals``, ``run_logs``: SQLite keeps the single-column autoincrement rowid
  key (SQLite autoincrements nothing else) and gains ``UNIQUE (tenant_id, run_id, <id>)``;
  PostgreSQL's primary key becomes ``(tenant_id, run_id, <id>)`` (``events`` is
  partitioned by run_id, revision 0023: the key contains it). ``run_logs``' unique
  ``(run_id, seq)`` and ``(run_id, origin)`` lead with the tenant.
- ``ix_events_run_id_event_id`` is dropped: the new key's ``(tenant_id, run_id)`` prefix
  serves every read of one run's events (each names the tenant). On PostgreSQL
  ``ix_events_event_id`` takes over what the old ``(event_id, run_id)`` key also served,
  maintenance's pick of old events in id order and its trim by id; SQLite's rowid serves
  them there.

Every child already has ``tenant_id`` (NOT NULL), written from its run; it is set from the
run again here (only rows that disagree, none unless edited by hand), so the composite
foreign key holds.

On SQLite a primary key changes only by rebuilding the table (alembic batch mode), and
with ``foreign_keys=ON`` (app/db/database.py; the pragma cannot change inside the
migration's transaction) dropping ``runs`` during its rebuild is an implicit ``DELETE``
that would cascade into every child. So, as revision 0022 does, the children's rows are
first stashed in temporary tables (and the children emptied: their rebuilds then copy
nothing), and put back with their run's tenant once ``runs`` and they are rebuilt.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-03 11:00:00.000000
"""

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


@dataclass(frozen=True)
class _Child:
    """One table with a foreign key to ``runs``: its keys before and after 0027."""

    name: str
    # The primary key after (both dialects, unless ``rowid`` is set: then PostgreSQL's).
    key: tuple[str, ...]
    # The primary key before, on PostgreSQL (SQLite's is ``rowid`` when that is set).
    old_key: tuple[str, ...]
    # SQLite's autoincrement rowid column, kept as its primary key.
    rowid: str | None = None
    # (old name, old columns) -> tenant-leading columns: unique constraints that move.
    uniques: tuple[tuple[str, tuple[str, ...]], ...] = ()


_CHILDREN = (
    _Child("run_labels", ("tenant_id", "run_id", "key"), ("run_id", "key")),
    _Child(
        "steps",
        ("tenant_id", "run_id", "step_id"),
        ("run_id", "step_id"),
        uniques=(("uq_steps_run_id_seq", ("run_id", "seq")),),
    ),
    _Child(
        "events", ("tenant_id", "run_id", "event_id"), ("event_id", "run_id"), rowid="event_id"
    ),
    _Child("dead_letters", ("tenant_id", "dead_letter_id"), ("dead_letter_id",)),
    _Child(
        "signals", ("tenant_id", "run_id", "signal_id"), ("signal_id",), rowid="signal_id"
    ),
    _Child(
        "approval_decisions",
        ("tenant_id", "run_id", "step_id", "decided_by"),
        ("run_id", "step_id", "decided_by"),
    ),
    _Child(
        "run_logs",
        ("tenant_id", "run_id", "id"),
        ("id",),
        rowid="id",
        uniques=(
            ("uq_run_logs_run_id_seq", ("run_id", "seq")),
            ("uq_run_logs_run_id_origin", ("run_id", "origin")),
        ),
    ),
    _Child("event_waits", ("tenant_id", "run_id", "step_id"), ("run_id", "step_id")),
)


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _uq_name(table: str, cols: Sequence[str]) -> str:
    return f"uq_{table}_{'_'.join(cols)}"


def _stash() -> None:
    # SQLite only: keep the children's rows out of reach of runs' rebuild.
    for child in _CHILDREN:
        op.execute(f"CREATE TEMP TABLE _keep_{child.name} AS SELECT * FROM {child.name}")
        op.execute(f"DELETE FROM {child.name}")


def _restore(*, from_run: bool) -> None:
    bind = op.get_bind()
    for child in _CHILDREN:
        cols = [c for c in bind.execute(sa.text(f"SELECT * FROM _keep_{child.name}")).keys()]
        rest = [c for c in cols if c != "tenant_id"]
        names = ", ".join(rest)
        picked = ", ".join(f"k.{c}" for c in rest)
        if from_run:
            # The run's tenant, whatever the stashed row said (the module docstring).
            op.execute(
                f"INSERT INTO {child.name} (tenant_id, {names}) SELECT r.tenant_id, {picked} "
                f"FROM _keep_{child.name} k JOIN runs r ON r.run_id = k.run_id"
            )
        else:
            op.execute(
                f"INSERT INTO {child.name} (tenant_id, {names}) SELECT k.tenant_id, {picked} "
                f"FROM _keep_{child.name} k"
            )
        op.execute(f"DROP TABLE _keep_{child.name}")


def upgrade() -> None:
    """Apply this revision."""
    sqlite = _sqlite()
    if sqlite:
        _stash()
    for child in _CHILDREN:
        if not sqlite:
            # One pass joining the run on its (still unique) id; only rows that disagree
            # are written.
            op.execute(
                f"UPDATE {child.name} AS c SET tenant_id = r.tenant_id FROM runs AS r "
                "WHERE r.run_id = c.run_id AND c.tenant_id <> r.tenant_id"
            )
        with op.batch_alter_table(child.name) as batch:
            batch.drop_constraint(f"fk_{child.name}_run_id_runs", type_="foreignkey")
            if child.rowid is None or not sqlite:
                batch.drop_constraint(f"pk_{child.name}", type_="primary")
                batch.create_primary_key(f"pk_{child.name}", list(child.key))
            else:
                batch.create_unique_constraint(_uq_name(child.name, child.key), list(child.key))
            for old_name, old_cols in child.uniques:
                batch.drop_constraint(old_name, type_="unique")
                new_cols = ["tenant_id", *old_cols]
                batch.create_unique_constraint(_uq_name(child.name, new_cols), new_cols)
            if child.name == "events":
                batch.drop_index("ix_events_run_id_event_id")
    if not sqlite:
        op.create_index("ix_events_event_id", "events", ["event_id"])
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("pk_runs", type_="primary")
        batch.create_primary_key("pk_runs", ["tenant_id", "run_id"])
        batch.drop_index("ix_runs_tenant_id_run_id")
        batch.create_index("ix_runs_run_id", ["run_id"])
    for child in _CHILDREN:
        with op.batch_alter_table(child.name) as batch:
            batch.create_foreign_key(
                f"fk_{child.name}_tenant_id_runs",
                "runs",
                ["tenant_id", "run_id"],
                ["tenant_id", "run_id"],
                ondelete="CASCADE",
            )
    if sqlite:
        _restore(from_run=True)


def downgrade() -> None:
    """Revert this revision (every row kept)."""
    sqlite = _sqlite()
    if sqlite:
        _stash()
    if not sqlite:
        op.drop_index("ix_events_event_id", table_name="events")
    for child in _CHILDREN:
        with op.batch_alter_table(child.name) as batch:
            batch.drop_constraint(f"fk_{child.name}_tenant_id_runs", type_="foreignkey")
            if child.rowid is None or not sqlite:
                batch.drop_constraint(f"pk_{child.name}", type_="primary")
                batch.create_primary_key(f"pk_{child.name}", list(child.old_key))
            else:
                batch.drop_constraint(_uq_name(child.name, child.key), type_="unique")
            for old_name, old_cols in child.uniques:
                batch.drop_constraint(_uq_name(child.name, ["tenant_id", *old_cols]), "unique")
                batch.create_unique_constraint(old_name, list(old_cols))
            if child.name == "events":
                batch.create_index("ix_events_run_id_event_id", ["run_id", "event_id"])
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_run_id")
        batch.drop_constraint("pk_runs", type_="primary")
        batch.create_primary_key("pk_runs", ["run_id"])
        batch.create_index("ix_runs_tenant_id_run_id", ["tenant_id", "run_id"])
    for child in _CHILDREN:
        with op.batch_alter_table(child.name) as batch:
            batch.create_foreign_key(
                f"fk_{child.name}_run_id_runs", "runs", ["run_id"], ["run_id"], ondelete="CASCADE"
            )
    if sqlite:
        _restore(from_run=False)
