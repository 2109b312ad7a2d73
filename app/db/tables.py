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
    ForeignKey,
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
    # JSON of app.sdk.queue.QueueControls.to_json(); NULL (registered before 0008): defaults.
    Column("queue_controls", Text, nullable=True),
    Column("first_registered_at", UtcDateTime, nullable=False),
    Column("last_registered_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("name", "version"),
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
    Column("run_id", Uuid, primary_key=True),
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
    UniqueConstraint("tenant_id", "idempotency_key"),
    Index(
        "ix_runs_lease_owner",
        "lease_owner",
        postgresql_where=text("lease_owner IS NOT NULL"),
        sqlite_where=text("lease_owner IS NOT NULL"),
    ),
    Index("ix_runs_tenant_id_run_id", "tenant_id", "run_id"),
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
    Column("run_id", Uuid, ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
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
    PrimaryKeyConstraint("run_id", "step_id"),
    UniqueConstraint("run_id", "seq"),
)

events = Table(
    "events",
    metadata,
    Column("event_id", BigIntPK, primary_key=True, autoincrement=True),
    Column("run_id", Uuid, ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("step_id", String(255), nullable=True),
    Column("actor", String(255), nullable=True),
    Column("data", Text, nullable=True),
    Index("ix_events_run_id_event_id", "run_id", "event_id"),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("dead_letter_id", Uuid, primary_key=True),
    Column("run_id", Uuid, ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
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
    Index("ix_dead_letters_tenant_id_status", "tenant_id", "status"),
    Index("ix_dead_letters_run_id", "run_id"),
)

signals = Table(
    "signals",
    metadata,
    Column("signal_id", BigIntPK, primary_key=True, autoincrement=True),
    Column("run_id", Uuid, ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("name", String(200), nullable=False),
    Column("payload", Text, nullable=True),
    Column("sent_by", String(255), nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    # Set once, by the wait that consumed it: a signal is delivered exactly once.
    Column("consumed_step_id", String(255), nullable=True),
    Column("consumed_at", UtcDateTime, nullable=True),
    Index("ix_signals_run_id_name_signal_id", "run_id", "name", "signal_id"),
)

approval_decisions = Table(
    "approval_decisions",
    metadata,
    Column("run_id", Uuid, ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    Column("step_id", String(255), nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("decided_by", String(255), nullable=False),
    Column("decision", String(16), nullable=False),
    Column("payload", Text, nullable=True),
    Column("comment", Text, nullable=True),
    Column("decided_at", UtcDateTime, nullable=False),
    PrimaryKeyConstraint("run_id", "step_id", "decided_by"),
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
    Column("schedule_id", Uuid, primary_key=True),
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
    UniqueConstraint("tenant_id", "name"),
    Index(
        "ix_schedules_due",
        "next_fire_at",
        postgresql_where=text("state = 'active'"),
        sqlite_where=text("state = 'active'"),
    ),
    Index("ix_schedules_tenant_id_schedule_id", "tenant_id", "schedule_id"),
)

schedule_fires = Table(
    "schedule_fires",
    metadata,
    Column(
        "schedule_id",
        Uuid,
        ForeignKey("schedules.schedule_id", ondelete="CASCADE"),
        nullable=False,
    ),
    # The nominal tick (not the jittered or late fire time). The primary key on
    # (schedule_id, tick) is what makes a tick fire exactly once across every process.
    Column("tick", UtcDateTime, nullable=False),
    Column("tenant_id", String(128), nullable=False),
    Column("kind", String(16), nullable=False),  # cron, once, manual
    Column("outcome", String(16), nullable=False),  # started, skipped, buffered, failed
    Column("run_id", Uuid, nullable=True),
    Column("fired_at", UtcDateTime, nullable=False),
    Column("fired_by", String(255), nullable=False),
    Column("error", Text, nullable=True),
    PrimaryKeyConstraint("schedule_id", "tick"),
    Index("ix_schedule_fires_run_id", "run_id"),
)

runs_archive = Table(
    "runs_archive",
    metadata,
    # A finished run moved out of ``runs`` by maintenance archival: its summary and (unless
    # compacted first) its payloads; steps, events, signals, decisions and dead letters are
    # dropped. Reads of an archived id answer 404 with code ``run_archived``.
    Column("run_id", Uuid, primary_key=True),
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
    Index("ix_runs_archive_tenant_id_run_id", "tenant_id", "run_id"),
)
