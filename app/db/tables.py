"""Every table of Treadle on one ``MetaData`` with a naming convention.

Alembic migrations under ``alembic/versions`` must produce exactly this schema
(``tests/migrations`` compares them). Payload columns are JSON *text* (see
``app.core.json``); timestamps are :class:`UtcDateTime` written from the database clock.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)

from app.db.types import BigIntPK, UtcDateTime

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# steps, events and runs_archive on PostgreSQL: range partitions of UUIDv7 run ids, i.e.
# of run creation time (docs/adr/0036-time-partitions.md; app/db/partitions.py).
PARTITION_BY = "RANGE (run_id)"

# The terminal run statuses (TERMINAL_RUN_STATUSES) as an SQL list, for index predicates.
TERMINAL_STATUSES_SQL = "('completed', 'failed', 'cancelled', 'compensated')"
# A run holds its concurrency slot while it is not terminal: the terminal write itself
# frees the slot, whichever path makes it.
ACTIVE_CONCURRENCY_SLOT_WHERE = (
    f"concurrency_slot IS NOT NULL AND status NOT IN {TERMINAL_STATUSES_SQL}"
)
# A keyed run without a slot that is not terminal waits for one (on_limit="queue").
WAITING_FOR_SLOT_WHERE = (
    "concurrency_key IS NOT NULL AND concurrency_slot IS NULL "
    f"AND status NOT IN {TERMINAL_STATUSES_SQL}"
)

workflow_definitions = Table(
    "workflow_definitions",
    metadata,
    Column("name", String(200), nullable=False),
    Column("version", String(64), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("input_schema", Text, nullable=False),
    Column("output_schema", Text, nullable=False),
    # Who may see a run of this definition: ``tenant`` (anyone of the tenant) or ``owner``
    # (only the submitting subject). Stored here so the API never imports handler code.
    Column("access", String(16), nullable=False, server_default=text("'tenant'")),
    # State machines: JSON list of their states (name, fields schema, timer, terminal).
    Column("states", Text, nullable=True),
    # DAGs: JSON list of their nodes, each with the nodes it follows (``after``).
    Column("graph", Text, nullable=True),
    # JSON of app.sdk.queue.QueueControls.to_json(); NULL (registered before 0008): defaults.
    Column("queue_controls", Text, nullable=True),
    # Event triggers (revision 0020, docs/adr/0029-event-triggers.md): the event name a
    # POST /events starts this version on, and the JSON of its declarative filter
    # (app/core/event_match.py); NULL for a definition that no event starts.
    Column("on_event", String(200), nullable=True),
    Column("event_filter", Text, nullable=True),
    Column("first_registered_at", UtcDateTime, nullable=False),
    Column("last_registered_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("name", "version"),
    Index("ix_workflow_definitions_on_event", "on_event"),
)

workers = Table(
    "workers",
    metadata,
    Column("worker_id", String(200), primary_key=True),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("definitions", Text, nullable=False),  # JSON list of "name@version"
    Column("started_at", UtcDateTime, nullable=False),
    Column("last_heartbeat_at", UtcDateTime, nullable=False),
    Column("stopped_at", UtcDateTime, nullable=True),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("workflow", String(200), nullable=False),
    Column("version", String(64), nullable=False),
    Column("status", String(32), nullable=False),
    Column("reason", String(64), nullable=True),
    Column("input", Text, nullable=False),
    Column("output", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("idempotency_key", String(255), nullable=True),
    Column("request_hash", String(64), nullable=True),
    Column("concurrency_key", String(255), nullable=True),
    # Which of the key's ``key_limit`` slots (1..N) the run holds; NULL without a key, or
    # while it waits for a slot (docs/adr/0008-queue-controls.md).
    Column("concurrency_slot", Integer, nullable=True),
    # A run waiting for a slot: the start time it asked for (submit + ``delay``), applied
    # when a slot is granted; NULL otherwise.
    Column("not_before", UtcDateTime, nullable=True),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    # The fence (generation) is bumped by every claim and by cancel; every worker write
    # carries ``fence = :fence`` so a worker that lost its lease can never commit.
    Column("fence", BigInteger, nullable=False, server_default=text("0")),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    # Claims in a row whose lease was lost before any step progress was journaled
    # (revision 0025, docs/adr/0040-one-commit-per-step.md): a fast step writes no
    # ``running`` start record, so this is what counts its lost attempts.
    Column("lost_claims", Integer, nullable=False, server_default=text("0")),
    Column("lease_owner", String(200), nullable=True),
    Column("lease_expires_at", UtcDateTime, nullable=True),
    # When the run may next be claimed: queued/retry/timer due time, or the lease expiry of
    # a running run (so expired leases are reclaimed by the same query). NULL = not
    # claimable (terminal, or waiting on something without a deadline).
    Column("available_at", UtcDateTime, nullable=True),
    Column("blocked_reason", Text, nullable=True),
    Column("waiting_kind", String(32), nullable=True),
    Column("waiting_name", String(200), nullable=True),
    Column("waiting_deadline", UtcDateTime, nullable=True),
    Column("parent_run_id", Uuid, nullable=True),
    Column("created_by", String(255), nullable=False),
    # The API key the run was submitted with (None for a JWT): every worker attempt
    # re-checks that it is not revoked.
    Column("api_key_id", Uuid, nullable=True),
    # The definition's access policy, copied at submit: ``tenant`` or ``owner``.
    Column("access", String(16), nullable=False, server_default=text("'tenant'")),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("started_at", UtcDateTime, nullable=True),
    Column("finished_at", UtcDateTime, nullable=True),
    # Set by maintenance compaction once the run's payloads were cleared (revision 0005).
    Column("compacted_at", UtcDateTime, nullable=True),
    # When a cancel was first requested; never cleared, so the request survives a failed
    # compensation, requeue, retry and resume (revision 0011,
    # docs/adr/0009-requeue-into-compensation.md).
    Column("cancel_requested_at", UtcDateTime, nullable=True),
    # A pause (revision 0015, docs/adr/0021-pause-is-a-flag-beside-the-status.md): set
    # while the run is paused, never claimed meanwhile; the status keeps what it waits on.
    Column("paused_at", UtcDateTime, nullable=True),
    Column("paused_by", String(255), nullable=True),
    Column("pause_reason", Text, nullable=True),
    # A rerun (docs/adr/0022-rerun-from-a-step.md): the original run and the step the
    # rerun executes from (its journal is the original's up to, not including, that step).
    Column("rerun_of", Uuid, nullable=True),
    Column("rerun_from_step", String(255), nullable=True),
    # The run's labels as a JSON object, the copy every run view returns; run_labels is
    # the index the filters use. Both are written only by app/db/queries/run_labels.py,
    # in one transaction (revision 0014, docs/adr/0020-run-labels.md).
    Column("labels", Text, nullable=True),
    # The W3C trace context (traceparent, tracestate) the run was submitted under; each
    # execution is traced as its child (revision 0018,
    # docs/adr/0026-traces-as-an-optional-extra.md).
    Column("trace_parent", String(55), nullable=True),
    Column("trace_state", String(512), nullable=True),
    # Tenant-leading (revision 0027, docs/adr/0034-tenant-leading-keys.md). No UNIQUE
    # (run_id) beside it: run ids are UUIDv7s minted by app.core.ids.new_run_id, unique by
    # construction, and a distributed table could not enforce a key without tenant_id.
    PrimaryKeyConstraint("tenant_id", "run_id"),
    UniqueConstraint("tenant_id", "idempotency_key"),
    # Not unique (see the key above): the statements that find a run by id alone, the
    # claim's update of the runs it picked, the lease renewal and the operator paths not
    # yet keyed by tenant (ADR 0034, revision 0027), stay one-row index lookups. A
    # distributed table may keep a non-unique index as it is.
    Index("ix_runs_run_id", "run_id"),
    Index(
        "ix_runs_lease_owner",
        "lease_owner",
        postgresql_where=text("lease_owner IS NOT NULL"),
        sqlite_where=text("lease_owner IS NOT NULL"),
    ),
    # Maintenance walks finished runs oldest first (keyset on finished_at, run_id).
    Index(
        "ix_runs_finished_at_run_id",
        "finished_at",
        "run_id",
        postgresql_where=text("finished_at IS NOT NULL"),
        sqlite_where=text("finished_at IS NOT NULL"),
    ),
    # At most one active run per (tenant, workflow, concurrency key, slot), slots 1..N:
    # however a writer decides, no two active runs ever hold one slot of a key.
    Index(
        "uq_runs_active_concurrency_slot",
        "tenant_id",
        "workflow",
        "concurrency_key",
        "concurrency_slot",
        unique=True,
        postgresql_where=text(ACTIVE_CONCURRENCY_SLOT_WHERE),
        sqlite_where=text(ACTIVE_CONCURRENCY_SLOT_WHERE),
    ),
    # The runs waiting for a slot of a key, oldest (submission order) first.
    Index(
        "ix_runs_waiting_for_slot",
        "tenant_id",
        "workflow",
        "concurrency_key",
        "run_id",
        postgresql_where=text(WAITING_FOR_SLOT_WHERE),
        sqlite_where=text(WAITING_FOR_SLOT_WHERE),
    ),
    Index("ix_runs_tenant_id_status_run_id", "tenant_id", "status", "run_id"),
    Index("ix_runs_tenant_id_workflow_run_id", "tenant_id", "workflow", "run_id"),
    # GET /runs filters (revision 0014): each leads with tenant_id and ends with run_id,
    # so a filtered page is an index range read newest first.
    Index("ix_runs_tenant_id_reason_run_id", "tenant_id", "reason", "run_id"),
    Index("ix_runs_tenant_id_version_run_id", "tenant_id", "version", "run_id"),
    Index("ix_runs_tenant_id_finished_at", "tenant_id", "finished_at"),
    # GET /runs/counts by created time has no LIMIT to stop a walk of the tenant's ids.
    Index("ix_runs_tenant_id_created_at", "tenant_id", "created_at"),
    Index(
        "ix_runs_tenant_id_waiting_run_id",
        "tenant_id",
        "waiting_kind",
        "waiting_name",
        "run_id",
        postgresql_where=text("waiting_kind IS NOT NULL"),
        sqlite_where=text("waiting_kind IS NOT NULL"),
    ),
)

# PostgreSQL compares label text in the "C" collation (bytes, i.e. codepoints): the
# order SQLite's BINARY collation uses, and the one under which a prefix is an index
# range (app/core/labels.py prefix_upper_bound).
LABEL_KEY = String(64).with_variant(String(64, collation="C"), "postgresql")
LABEL_VALUE = String(256).with_variant(String(256, collation="C"), "postgresql")

# One row per (run, label key): the index of GET /runs ``label.<key>=`` filters.
# tenant_id is copied from the run so a lookup never leaves the tenant's index range.
run_labels = Table(
    "run_labels",
    metadata,
    Column("run_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("key", LABEL_KEY, nullable=False),
    Column("value", LABEL_VALUE, nullable=False),
    # Tenant-leading (revision 0027, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "run_id", "key"),
    ForeignKeyConstraint(
        ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], ondelete="CASCADE"
    ),
    # Equality and prefix (a range on value) per tenant and key, run ids in order.
    Index("ix_run_labels_tenant_id_key_value_run_id", "tenant_id", "key", "value", "run_id"),
)

# Claim order: higher priority first, then the longest due. Only rows with available_at are
# indexed (claimable or leased), so finished runs never slow a claim (revision 0010).
Index(
    "ix_runs_claimable",
    runs.c.priority.desc(),
    runs.c.available_at,
    postgresql_where=text("available_at IS NOT NULL"),
    sqlite_where=text("available_at IS NOT NULL"),
)

# Rate limits (app/sdk/queue.py RateLimit): one GCRA bucket per workflow, or per workflow
# and (tenant, concurrency key). ``tat`` is the theoretical arrival time of the next start
# (ITU-T I.371), UTC database time.
rate_limit_buckets = Table(
    "rate_limit_buckets",
    metadata,
    Column("workflow", String(200), nullable=False),
    Column("bucket", String(400), nullable=False),
    Column("tat", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("workflow", "bucket"),
)

steps = Table(
    "steps",
    metadata,
    Column("run_id", Uuid, nullable=False),
    Column("step_id", String(255), nullable=False),
    Column("tenant_id", String(128), nullable=False),
    # Call order within the run; replay compares it to detect nondeterminism.
    Column("seq", Integer, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("name", String(255), nullable=False),  # the activity function's qualified name
    Column("status", String(32), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("output", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("next_attempt_at", UtcDateTime, nullable=True),
    # Waits (timer, signal, approval): when the wait times out or the timer fires, and the
    # wait's settings as JSON text (approval group, approvals needed, …).
    Column("deadline", UtcDateTime, nullable=True),
    Column("detail", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("started_at", UtcDateTime, nullable=True),
    Column("finished_at", UtcDateTime, nullable=True),
    Column("fence", BigInteger, nullable=False),
    # Tenant-leading (revision 0027, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "run_id", "step_id"),
    UniqueConstraint("tenant_id", "run_id", "seq"),
    ForeignKeyConstraint(
        ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], ondelete="CASCADE"
    ),
    # PostgreSQL: weekly partitions by run id, i.e. by run creation time (revision 0023,
    # docs/adr/0036-time-partitions.md); the keys above contain it, as they must.
    postgresql_partition_by=PARTITION_BY,
)

events = Table(
    "events",
    metadata,
    Column("event_id", BigIntPK, primary_key=True, autoincrement=True),
    Column("run_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("step_id", String(255), nullable=True),
    Column("actor", String(255), nullable=True),
    Column("data", Text, nullable=True),
    ForeignKeyConstraint(
        ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], ondelete="CASCADE"
    ),
    # Tenant-leading (revision 0027, docs/adr/0034-tenant-leading-keys.md). SQLite keeps
    # event_id alone as the primary key, its autoincrement rowid (SQLite autoincrements
    # nothing else), with the tenant-leading key beside it as a unique constraint;
    # PostgreSQL's primary key is that key (info below), which contains the partition key
    # as it must (revision 0023, docs/adr/0036-time-partitions.md). The sequence keeps
    # event_id unique on both; every reader orders one run's events by it, through this
    # key's (tenant_id, run_id) prefix.
    UniqueConstraint("tenant_id", "run_id", "event_id").ddl_if(dialect="sqlite"),
    # Maintenance's cross-tenant pick of old events walks event_id order and its trim
    # finds events by id (app/db/queries/maintenance.py): SQLite's rowid serves both, and
    # on PostgreSQL this index does, as the (event_id, run_id) key did before 0027.
    Index("ix_events_event_id", "event_id").ddl_if(dialect="postgresql"),
    postgresql_partition_by=PARTITION_BY,
    info={"postgresql_primary_key": ("tenant_id", "run_id", "event_id")},
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("dead_letter_id", Uuid, nullable=False),
    Column("run_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("workflow", String(200), nullable=False),
    Column("reason", String(64), nullable=False),
    Column("error", Text, nullable=True),
    Column("status", String(32), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("requeued_at", UtcDateTime, nullable=True),
    Column("requeued_by", String(255), nullable=True),
    Column("requeue_reason", Text, nullable=True),
    Column("correlation_id", String(255), nullable=True),
    # Tenant-leading (revision 0027, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "dead_letter_id"),
    ForeignKeyConstraint(
        ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], ondelete="CASCADE"
    ),
    Index("ix_dead_letters_tenant_id_status", "tenant_id", "status"),
    Index("ix_dead_letters_run_id", "run_id"),
)

signals = Table(
    "signals",
    metadata,
    Column("signal_id", BigIntPK, primary_key=True, autoincrement=True),
    Column("run_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("name", String(200), nullable=False),
    Column("payload", Text, nullable=True),
    Column("sent_by", String(255), nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    # Set once, by the wait that consumed it: a signal is delivered exactly once.
    Column("consumed_step_id", String(255), nullable=True),
    Column("consumed_at", UtcDateTime, nullable=True),
    # Tenant-leading (revision 0027, docs/adr/0034-tenant-leading-keys.md): as for events,
    # SQLite's key is the rowid with the tenant-leading key beside it; PostgreSQL's is it.
    UniqueConstraint("tenant_id", "run_id", "signal_id").ddl_if(dialect="sqlite"),
    ForeignKeyConstraint(
        ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], ondelete="CASCADE"
    ),
    Index("ix_signals_run_id_name_signal_id", "run_id", "name", "signal_id"),
    info={"postgresql_primary_key": ("tenant_id", "run_id", "signal_id")},
)

approval_decisions = Table(
    "approval_decisions",
    metadata,
    Column("run_id", Uuid, nullable=False),
    Column("step_id", String(255), nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("decided_by", String(255), nullable=False),
    Column("decision", String(16), nullable=False),
    Column("payload", Text, nullable=True),
    Column("comment", Text, nullable=True),
    Column("decided_at", UtcDateTime, nullable=False),
    # Tenant-leading (revision 0027, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "run_id", "step_id", "decided_by"),
    ForeignKeyConstraint(
        ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], ondelete="CASCADE"
    ),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", Uuid, primary_key=True),
    Column("tenant_id", String(128), nullable=False),
    Column("name", String(200), nullable=False),
    # The public part of the key (``trd_<prefix>_<secret>``), unique, used for lookup.
    Column("prefix", String(32), nullable=False),
    # SHA-256 (hex) of the whole key; the key itself is never stored. A fast hash is
    # enough: the secret is 256 random bits, so there is nothing to brute-force.
    Column("secret_hash", String(64), nullable=False),
    Column("scopes", Text, nullable=False),  # space-separated
    Column("created_by", String(255), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("revoked_at", UtcDateTime, nullable=True),
    Column("revoked_by", String(255), nullable=True),
    Column("last_used_at", UtcDateTime, nullable=True),
    UniqueConstraint("prefix"),
    Index("ix_api_keys_tenant_id_key_id", "tenant_id", "key_id"),
)

tenants = Table(
    "tenants",
    metadata,
    # Only tenants an operator has acted on have a row: a tenant with none is active, so
    # tenants need no registration (they come from token claims and API keys).
    Column("tenant_id", String(128), primary_key=True),
    Column("status", String(16), nullable=False),  # active, suspended
    # Why the tenant was suspended (operators only: never shown to the tenant); NULL once
    # resumed.
    Column("reason", Text, nullable=True),
    Column("changed_by", String(255), nullable=False),  # subject of the last change
    Column("changed_at", UtcDateTime, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    CheckConstraint("status IN ('active', 'suspended')", name="status"),
)

schedules = Table(
    "schedules",
    metadata,
    Column("schedule_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("name", String(200), nullable=False),
    Column("workflow", String(200), nullable=False),
    Column("version", String(64), nullable=True),  # None: the latest at each fire
    Column("input", Text, nullable=False),
    # Exactly one of ``cron`` (5 fields, evaluated in ``timezone``) and ``at`` (one-off).
    Column("cron", String(255), nullable=True),
    Column("timezone", String(64), nullable=False),
    Column("at", UtcDateTime, nullable=True),
    Column("overlap", String(32), nullable=False),
    Column("catchup_window_seconds", Integer, nullable=False),
    Column("jitter_seconds", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # active, paused, completed
    # The nominal time of the next tick, and when it fires (tick + deterministic jitter).
    # Scheduler loops look for ``next_fire_at <= now`` among active schedules.
    Column("next_tick_at", UtcDateTime, nullable=True),
    Column("next_fire_at", UtcDateTime, nullable=True),
    Column("last_tick_at", UtcDateTime, nullable=True),
    # buffer_one: the one tick held back until the open run finishes.
    Column("buffered_tick_at", UtcDateTime, nullable=True),
    Column("fired_count", BigInteger, nullable=False, server_default=text("0")),
    Column("missed_count", BigInteger, nullable=False, server_default=text("0")),
    Column("skipped_count", BigInteger, nullable=False, server_default=text("0")),
    Column("last_error", Text, nullable=True),
    # The principal every run it starts acts for (revision 0012): ``created_by``, the API
    # key it was created with (None for a JWT; each fire re-checks it is not revoked) and
    # the access policy of its workflow (``owner``: only ``created_by`` sees or changes it).
    Column("created_by", String(255), nullable=False),
    Column("api_key_id", Uuid, nullable=True),
    Column("access", String(16), nullable=False, server_default=text("'tenant'")),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    # Tenant-leading (revision 0024, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "schedule_id"),
    UniqueConstraint("tenant_id", "name"),
    # The scheduler's two scans stay global: one loop serves every tenant, and a
    # tenant-leading index would cost it a scan per tenant (docs/adr/0034-…, revision
    # 0024). Neither index is unique, so a distributed table may keep them as they are.
    Index(
        "ix_schedules_due",
        "next_fire_at",
        postgresql_where=text("state = 'active'"),
        sqlite_where=text("state = 'active'"),
    ),
    # Schedules holding a buffer_one tick back (few, usually none): without it every
    # scheduler pass read all of ``schedules``.
    Index(
        "ix_schedules_buffered",
        "tenant_id",
        "schedule_id",
        postgresql_where=text("state = 'active' AND buffered_tick_at IS NOT NULL"),
        sqlite_where=text("state = 'active' AND buffered_tick_at IS NOT NULL"),
    ),
)

schedule_fires = Table(
    "schedule_fires",
    metadata,
    Column("schedule_id", Uuid, nullable=False),
    # The nominal tick (not the jittered or late fire time). The primary key on
    # (tenant_id, schedule_id, tick) is what makes a tick fire exactly once across every
    # process (a schedule's tenant never changes, so it is the old (schedule_id, tick)).
    Column("tick", UtcDateTime, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("kind", String(16), nullable=False),  # cron, once, manual
    Column("outcome", String(16), nullable=False),  # started, skipped, buffered, failed
    Column("run_id", Uuid, nullable=True),
    Column("fired_at", UtcDateTime, nullable=False),
    Column("fired_by", String(255), nullable=False),
    Column("error", Text, nullable=True),
    # Tenant-leading (revision 0024, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "schedule_id", "tick"),
    ForeignKeyConstraint(
        ["tenant_id", "schedule_id"],
        ["schedules.tenant_id", "schedules.schedule_id"],
        ondelete="CASCADE",
    ),
    # Which tick started a run. No hot query reads it today (overlap checks drive from the
    # primary key); it leads with the tenant because wherever a run is known, so is its
    # tenant.
    Index("ix_schedule_fires_tenant_id_run_id", "tenant_id", "run_id"),
)

runs_archive = Table(
    "runs_archive",
    metadata,
    # A finished run moved out of ``runs`` by maintenance archival: its summary and (unless
    # compacted first) its payloads; steps, events, signals, decisions and dead letters are
    # dropped. Reads of an archived id answer 404 with code ``run_archived``.
    Column("run_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("workflow", String(200), nullable=False),
    Column("version", String(64), nullable=False),
    Column("status", String(32), nullable=False),
    Column("reason", String(64), nullable=True),
    Column("input", Text, nullable=False),
    Column("output", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("idempotency_key", String(255), nullable=True),
    Column("parent_run_id", Uuid, nullable=True),
    Column("created_by", String(255), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("started_at", UtcDateTime, nullable=True),
    Column("finished_at", UtcDateTime, nullable=True),
    Column("compacted_at", UtcDateTime, nullable=True),
    Column("archived_at", UtcDateTime, nullable=False),
    # Tenant-leading (revision 0026, docs/adr/0034-tenant-leading-keys.md); it contains the
    # partition key, as PostgreSQL requires of a partitioned table's keys.
    PrimaryKeyConstraint("tenant_id", "run_id"),
    # PostgreSQL: partitioned like steps (revision 0023, docs/adr/0036-time-partitions.md).
    postgresql_partition_by=PARTITION_BY,
)

console_sessions = Table(
    "console_sessions",
    metadata,
    # SHA-256 (hex) of the cookie's session id: the id itself is never stored, so a copy
    # of this table names no live cookie (docs/adr/0017-console-architecture.md).
    Column("id_hash", String(64), primary_key=True),
    Column("tenant_id", String(128), nullable=False),
    Column("subject", String(255), nullable=False),
    # The signed-in user's token, AES-GCM under a key derived (HKDF) from the session id
    # and TREADLE_CONSOLE_SECRET: base64url of nonce || ciphertext || tag. Neither the
    # database alone nor the secret alone can decrypt it.
    Column("token_ciphertext", Text, nullable=False),
    Column("csrf_token", String(64), nullable=False),
    # One message shown on the next full page (``{"kind", "text"}`` JSON), then cleared.
    Column("flash", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("last_seen_at", UtcDateTime, nullable=False),
    # The absolute deadline (created_at + TREADLE_CONSOLE_ABSOLUTE_TIMEOUT_SECONDS); the
    # idle timeout is checked against last_seen_at.
    Column("expires_at", UtcDateTime, nullable=False),
    Index("ix_console_sessions_expires_at", "expires_at"),
)

# Bulk actions on runs as durable batches (revision 0017, docs/adr/0023-durable-batches.md).
batches = Table(
    "batches",
    metadata,
    Column("batch_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("action", String(16), nullable=False),  # cancel, retry, resume, signal, pause, unpause
    # What was asked: ``{"run_ids": [...]}`` or ``{"filter": {...}}`` (JSON text), and the
    # signal's ``name``/``payload`` for a signal batch.
    Column("selection", Text, nullable=False),
    Column("params", Text, nullable=False),
    Column("reason", Text, nullable=True),
    Column("created_by", String(255), nullable=False),
    # The creator's owner filter (None: every run of the tenant is visible to it); each
    # item is acted on with it, as the single-run action would be.
    Column("owner", String(255), nullable=True),
    # The creator's scopes (JSON text list) and API key (None: a JWT): the batch runner
    # re-checks each item under them (revision 0029; NULL scopes: created before it,
    # refused).
    Column("scopes", Text, nullable=True),
    Column("api_key_id", Uuid, nullable=True),
    Column("state", String(16), nullable=False),  # running, completed, cancelled
    Column("matched", BigInteger, nullable=False),
    Column("done", BigInteger, nullable=False, server_default=text("0")),
    Column("skipped", BigInteger, nullable=False, server_default=text("0")),
    Column("failed", BigInteger, nullable=False, server_default=text("0")),
    # ``{"already_terminal": n, ...}`` JSON text; ``failures`` keeps the last few errors.
    Column("skipped_reasons", Text, nullable=False, server_default=text("'{}'")),
    Column("failures", Text, nullable=False, server_default=text("'[]'")),
    # Keyset cursor: every item with run_id <= cursor is accounted for.
    Column("cursor", Uuid, nullable=True),
    Column("lease_owner", String(255), nullable=True),
    Column("lease_until", UtcDateTime, nullable=True),
    Column("fence", BigInteger, nullable=False, server_default=text("0")),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime, nullable=True),
    # Tenant-leading (revision 0022, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "batch_id"),
    Index(
        "ix_batches_running",
        "lease_until",
        postgresql_where=text("state = 'running'"),
        sqlite_where=text("state = 'running'"),
    ),
)

# The runs a batch acts on, fixed when it is created, so ``matched`` is exact however the
# runs change meanwhile; processed in run_id order behind ``batches.cursor``.
batch_items = Table(
    "batch_items",
    metadata,
    # Copied from the batch (revision 0022, docs/adr/0034-tenant-leading-keys.md): the
    # items live on the batch's shard and the batch's key leads with the tenant.
    Column("tenant_id", String(128), nullable=False),
    Column("batch_id", Uuid, nullable=False),
    Column("run_id", Uuid, nullable=False),
    # The outcome once processed (done, skipped:<reason>, failed).
    Column("outcome", String(64), nullable=True),
    PrimaryKeyConstraint("tenant_id", "batch_id", "run_id"),
    ForeignKeyConstraint(
        ["tenant_id", "batch_id"],
        ["batches.tenant_id", "batches.batch_id"],
        ondelete="CASCADE",
    ),
)

# Lines handler code logged with ctx.logger, kept with their run (docs/adr/0027-run-logs.md).
# ``seq`` orders a run's lines (1, 2, … up to TREADLE_RUN_LOG_MAX_LINES; the "N lines
# dropped" summary, when there is one, sits at the top of the INTEGER range). ``origin``
# names where the line was logged, deterministically across replays (``w:<position>:<n>``
# in workflow code, ``s:<step_id>:<attempt>:<n>`` in a step attempt): a replay that logs a
# line again finds its origin taken and appends nothing. ``message`` and ``fields`` are
# JSON text (a string, an object), like every payload (app/core/json.py): PostgreSQL text
# cannot hold NUL, JSON can spell it.
run_logs = Table(
    "run_logs",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    Column("tenant_id", String(128), nullable=False),
    Column("run_id", Uuid, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("origin", String(300), nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Column("level", String(16), nullable=False),
    Column("message", Text, nullable=False),
    Column("fields", Text, nullable=True),
    Column("step_id", String(255), nullable=True),
    Column("attempt", Integer, nullable=True),
    # Tenant-leading (revision 0027, docs/adr/0034-tenant-leading-keys.md): as for events,
    # SQLite's key is the rowid with the tenant-leading key beside it; PostgreSQL's is it.
    UniqueConstraint("tenant_id", "run_id", "id").ddl_if(dialect="sqlite"),
    UniqueConstraint("tenant_id", "run_id", "seq"),
    UniqueConstraint("tenant_id", "run_id", "origin"),
    ForeignKeyConstraint(
        ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], ondelete="CASCADE"
    ),
    info={"postgresql_primary_key": ("tenant_id", "run_id", "id")},
)

# Events posted to POST /events (revision 0020, docs/adr/0029-event-triggers.md). Named
# "inbound" so they never read as the run timeline (``events``). ``key`` makes a post
# idempotent per tenant; ``request_hash`` is the SHA-256 of its canonical name and data (a
# retry must repeat them). ``started_run_ids``: JSON list of the runs its triggers started,
# written with it. ``data`` is JSON text, like every payload (app/core/json.py).
inbound_events = Table(
    "inbound_events",
    metadata,
    Column("event_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("name", String(200), nullable=False),
    Column("data", Text, nullable=False),
    Column("key", String(255), nullable=True),
    Column("request_hash", String(64), nullable=False),
    Column("sent_by", String(255), nullable=False),
    # 1 when the sender held ``admin``. An access="owner" run takes only its owner's
    # (``sent_by``) or an admin's events, at the post or by a wait's look-back (revision
    # 0029, docs/security.md); 0, the default, is the stricter reading.
    Column("sent_by_admin", Integer, nullable=False, server_default=text("0")),
    Column("received_at", UtcDateTime, nullable=False),
    Column("started_run_ids", Text, nullable=False),
    # Tenant-leading (revision 0022, docs/adr/0034-tenant-leading-keys.md); GET /events
    # pages newest first on this key.
    PrimaryKeyConstraint("tenant_id", "event_id"),
    UniqueConstraint("tenant_id", "key"),
    # A wait that starts looks back through the tenant's events of its name (UUIDv7 ids
    # sort by arrival); GET /events lists newest first.
    Index("ix_inbound_events_tenant_id_name_event_id", "tenant_id", "name", "event_id"),
)

# One row per ctx.wait_for_event: the mailbox an event is delivered into. ``status`` is
# ``waiting`` until one compare-and-set moves it to ``delivered`` (``event_id`` set) or
# ``timed_out``, so a delivery and a timeout racing each other cannot both win. ``match``
# is the wait's JSON filter; ``since`` the run's creation time: events received from then
# on are delivered, even before the wait started (docs/adr/0029-event-triggers.md).
event_waits = Table(
    "event_waits",
    metadata,
    Column("run_id", Uuid, nullable=False),
    Column("step_id", String(255), nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("name", String(200), nullable=False),
    Column("match", Text, nullable=False),
    Column("since", UtcDateTime, nullable=False),
    Column("status", String(16), nullable=False),
    Column("event_id", Uuid, nullable=True),
    Column("delivered_at", UtcDateTime, nullable=True),
    # Tenant-leading (revision 0027, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "run_id", "step_id"),
    ForeignKeyConstraint(
        ["tenant_id", "run_id"], ["runs.tenant_id", "runs.run_id"], ondelete="CASCADE"
    ),
    CheckConstraint("status IN ('waiting', 'delivered', 'timed_out')", name="status"),
    Index("ix_event_waits_tenant_id_name_status", "tenant_id", "name", "status"),
    Index("ix_event_waits_event_id", "event_id"),
)

webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("endpoint_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("url", String(2048), nullable=False),
    # The terminal run statuses it receives, comma-delimited with a comma at each end
    # (",completed,failed,"), so one ``LIKE '%,' || status || ',%'`` matches it in the
    # terminal write's own statement (app/db/queries/webhooks.py).
    Column("events", String(200), nullable=False),
    # Only runs of this workflow (None: every workflow of the tenant).
    Column("workflow", String(200), nullable=True),
    # The signing secret, ``whsec_`` + base64 (Standard Webhooks). Kept readable: the
    # sender needs it to sign; the API shows it once, at creation.
    Column("secret", String(100), nullable=False),
    Column("created_by", String(255), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    # Tenant-leading (revision 0022, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "endpoint_id"),
)
"""Per-tenant targets of outbound webhooks (docs/adr/0030-outbound-webhooks.md)."""

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("delivery_id", Uuid, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    # No foreign key: a terminal write racing an endpoint's deletion must not fail on it
    # (the run's outcome would be refused). Its rows are deleted with it; a row written by
    # such a race is never claimed (the claim joins the endpoint).
    Column("endpoint_id", Uuid, nullable=False),
    # The terminal state delivered, copied in the terminal write: a later requeue or
    # archive of the run does not change what this delivery says.
    Column("run_id", Uuid, nullable=False),
    Column("workflow", String(200), nullable=False),
    Column("run_status", String(32), nullable=False),
    Column("run_reason", String(64), nullable=True),
    Column("finished_at", UtcDateTime, nullable=False),
    # pending -> delivered | failed.
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    # Due time of the next attempt; while an attempt is in flight, when its claim lapses
    # (a sender killed mid-POST leaves it due again then). None once final.
    Column("next_attempt_at", UtcDateTime, nullable=True),
    Column("lease_owner", String(200), nullable=True),
    Column("fence", BigInteger, nullable=False, server_default=text("0")),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    # Tenant-leading (revision 0022, docs/adr/0034-tenant-leading-keys.md).
    PrimaryKeyConstraint("tenant_id", "delivery_id"),
    Index(None, "endpoint_id", "created_at", "delivery_id"),
    # The sender's claim: due pending deliveries only.
    Index(
        "ix_webhook_deliveries_due",
        "next_attempt_at",
        postgresql_where=text("state = 'pending'"),
        sqlite_where=text("state = 'pending'"),
    ),
)
"""One row per (terminal state of a run, matching endpoint), written with the terminal state."""

webhook_attempts = Table(
    "webhook_attempts",
    metadata,
    # Copied from the delivery (revision 0022, docs/adr/0034-tenant-leading-keys.md).
    Column("tenant_id", String(128), nullable=False),
    Column("delivery_id", Uuid, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    # None while in flight, or forever if the sender died mid-attempt.
    Column("finished_at", UtcDateTime, nullable=True),
    Column("http_status", Integer, nullable=True),
    Column("error", Text, nullable=True),
    PrimaryKeyConstraint("tenant_id", "delivery_id", "attempt"),
    ForeignKeyConstraint(
        ["tenant_id", "delivery_id"],
        ["webhook_deliveries.tenant_id", "webhook_deliveries.delivery_id"],
        ondelete="CASCADE",
    ),
)
"""Each POST of a delivery: when, and the HTTP status or the error."""

# The read replica's heartbeat (revision 0028, docs/adr/0049-replica-lag-from-a-heartbeat.md):
# one row per database, its time written by the primary's clock about every second by
# each API process with TREADLE_READ_DATABASE_URL set (app/db/replica.py). On the standby
# its age is how stale the standby's copy may be, whether replay is slow or paused or the
# standby is cut off from the primary.
replica_heartbeat = Table(
    "replica_heartbeat",
    metadata,
    Column("id", Integer, nullable=False),
    Column("beat_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("id"),
    CheckConstraint("id = 1", name="single_row"),
)
"""The primary's last heartbeat for its read replicas: a single row (``id`` 1)."""
