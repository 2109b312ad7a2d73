"""Tenant-owned tables lead their keys with tenant_id (docs/adr/0034-tenant-leading-keys.md).

Read from the SQLAlchemy metadata (app/db/tables.py), the schema migrations must produce
(tests/migrations compares them). A table is tenant-leading when its primary key and every
unique constraint or unique index start with ``tenant_id`` and every foreign key to another
tenant-owned table includes it; each table is either that, a reference/global table, or a
table still to convert (``PENDING``, each with why). A new table has to be one of them.
"""

from __future__ import annotations

from sqlalchemy import Table, UniqueConstraint

from app.db.tables import metadata

# Global tables: on Citus, reference tables (or the coordinator's own), never sharded by
# tenant (docs/adr/0034-tenant-leading-keys.md).
REFERENCE = {
    "workflow_definitions": "registered by workers, read by every tenant's submits",
    "workers": "processes, no tenant",
    "rate_limit_buckets": "per-workflow buckets are shared by every tenant",
    "tenants": "the tenant list itself; keyed by tenant_id already",
    "replica_heartbeat": "one row per database, the primary's clock for its read replicas",
}

# Tenant-owned tables revisions 0022, 0024, 0026 and 0027 did not convert, each with what
# keeps it. The test fails once one of them becomes tenant-leading, so the list only shrinks.
PENDING = {
    "api_keys": "UNIQUE (prefix): looked up before the tenant is known",
    "console_sessions": "PK (id_hash): looked up from a cookie before the tenant is known",
}


def _tenant_owned(table: Table) -> bool:
    return "tenant_id" in table.c and table.name not in REFERENCE


def _violations(table: Table) -> list[str]:
    """What keeps ``table`` from being tenant-leading (empty: nothing)."""
    found: list[str] = []
    rowid = [c.name for c in table.primary_key.columns]
    # events, signals, run_logs: PostgreSQL's key is named in ``info``; SQLite keeps the
    # autoincrement rowid and must hold the same tenant-leading key as a unique
    # constraint beside it (revision 0027).
    pk = list(table.info.get("postgresql_primary_key") or rowid)
    if not pk or pk[0] != "tenant_id":
        found.append(f"primary key {pk}")
    if pk != rowid:
        beside = [
            [c.name for c in uq.columns]
            for uq in table.constraints
            if isinstance(uq, UniqueConstraint)
            and (only := uq._ddl_if) is not None
            and only.dialect == "sqlite"
        ]
        if len(rowid) != 1 or pk not in beside:
            found.append(f"SQLite key {rowid} without a unique {pk} beside it")
    for uq in table.constraints:
        cols = [c.name for c in getattr(uq, "columns", [])]
        if type(uq).__name__ == "UniqueConstraint" and (not cols or cols[0] != "tenant_id"):
            found.append(f"unique {cols}")
    for ix in table.indexes:
        cols = [c.name for c in ix.columns]
        if ix.unique and (not cols or cols[0] != "tenant_id"):
            found.append(f"unique index {ix.name} {cols}")
    for fk in table.foreign_key_constraints:
        referred = fk.referred_table
        if _tenant_owned(referred) and "tenant_id" not in fk.column_keys:
            found.append(f"foreign key {fk.column_keys} -> {referred.name}")
        elif _tenant_owned(referred):
            pairs = {e.parent.name: e.column.name for e in fk.elements}
            if pairs.get("tenant_id") != "tenant_id":
                found.append(f"foreign key {fk.column_keys} -> {referred.name} pairs tenant_id")
    return found


def test_every_table_is_classified() -> None:
    """Each table is tenant-owned or listed as reference; the lists name real tables."""
    names = set(metadata.tables)
    assert set(REFERENCE) <= names
    assert set(PENDING) <= names
    assert not set(REFERENCE) & set(PENDING)
    for name, table in metadata.tables.items():
        assert name in REFERENCE or "tenant_id" in table.c, (
            f"{name} has no tenant_id: add it or list it in REFERENCE with why"
        )


def test_tenant_owned_tables_lead_with_tenant_id() -> None:
    """Every tenant-owned table not PENDING has tenant-leading keys and foreign keys."""
    bad = {
        name: v
        for name, table in metadata.tables.items()
        if _tenant_owned(table) and name not in PENDING and (v := _violations(table))
    }
    assert bad == {}


def test_pending_tables_are_still_pending() -> None:
    """A converted table leaves PENDING, so the exemptions only shrink."""
    done = [name for name in PENDING if not _violations(metadata.tables[name])]
    assert done == []


def test_the_check_sees_a_single_column_key() -> None:
    """The checker itself flags what revision 0021 had (a guard against a vacuous test)."""
    from sqlalchemy import Column, ForeignKey, MetaData, PrimaryKeyConstraint, String, Uuid

    md = MetaData()
    parent = Table(
        "parent", md, Column("pid", Uuid, primary_key=True), Column("tenant_id", String(128))
    )
    child = Table(
        "child",
        md,
        Column("tenant_id", String(128)),
        Column("pid", Uuid, ForeignKey("parent.pid")),
        Column("n", String(8)),
        PrimaryKeyConstraint("pid", "n"),
    )
    assert _violations(parent) == ["primary key ['pid']"]
    assert _violations(child) == ["primary key ['pid', 'n']", "foreign key ['pid'] -> parent"]


def test_the_check_sees_a_rowid_key_without_its_tenant_leading_twin() -> None:
    """A PostgreSQL key in ``info`` needs the SQLite rowid's tenant-leading unique beside it."""
    from sqlalchemy import Column, Integer, MetaData, String, Uuid
    from sqlalchemy.schema import SchemaItem

    md = MetaData()

    def log(*extra: SchemaItem) -> Table:
        return Table(
            f"log{len(md.tables)}",
            md,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("tenant_id", String(128)),
            Column("run_id", Uuid),
            *extra,
            info={"postgresql_primary_key": ("tenant_id", "run_id", "id")},
        )

    twin = UniqueConstraint("tenant_id", "run_id", "id").ddl_if(dialect="sqlite")
    assert _violations(log(twin)) == []
    assert _violations(log()) == [
        "SQLite key ['id'] without a unique ['tenant_id', 'run_id', 'id'] beside it"
    ]
    everywhere = UniqueConstraint("tenant_id", "run_id", "id")  # PostgreSQL would build it twice
    assert _violations(log(everywhere)) == [
        "SQLite key ['id'] without a unique ['tenant_id', 'run_id', 'id'] beside it"
    ]
