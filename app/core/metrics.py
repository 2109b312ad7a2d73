"""Every Prometheus metric of Treadle, defined in one place (``treadle_<thing>_<unit>``).

Labels are bounded: workflow names, statuses, reasons, route templates, HTTP status
codes. Never run ids, tenants or other unbounded values. Each process (API, worker)
exposes the default registry: the API on ``GET /metrics``, a worker on
``--metrics-port``.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RUNS_SUBMITTED = Counter(
    "treadle_runs_submitted_total", "Runs created by POST /runs.", ["workflow"]
)
RUNS_FINISHED = Counter(
    "treadle_runs_finished_total",
    "Runs that reached a terminal status, by workflow, status and reason.",
    ["workflow", "status", "reason"],
)
RUN_CONTROLS = Counter(
    "treadle_run_controls_total",
    "Operator controls that changed a run, by action (pause, unpause, rerun).",
    ["action"],
)
BATCH_ITEMS = Counter(
    "treadle_batch_items_total",
    "Runs a bulk-action batch processed, by action and outcome (done, skipped, failed).",
    ["action", "outcome"],
)
WEBHOOK_ATTEMPTS = Counter(
    "treadle_webhook_attempts_total",
    "Webhook POSTs sent by workers, by outcome (delivered: a 2xx answer; failed: anything else).",
    ["outcome"],
)
WEBHOOK_DELIVERIES = Counter(
    "treadle_webhook_deliveries_total",
    "Webhook deliveries that reached a final state (delivered, failed).",
    ["state"],
)
STEP_DURATION = Histogram(
    "treadle_step_duration_seconds",
    "Duration of one step attempt (user code plus its checkpoint), by workflow and outcome.",
    ["workflow", "outcome"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
STEP_ATTEMPTS = Counter(
    "treadle_step_attempts_total", "Step attempts started, by workflow.", ["workflow"]
)
SCHEDULE_TO_START = Histogram(
    "treadle_schedule_to_start_seconds",
    "From a run becoming due (submitted, retry or timer due) to a worker claiming it.",
    ["workflow"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
GROUP_COMMIT_ROWS = Histogram(
    "treadle_group_commit_rows",
    "Rows per group commit of a worker's checkpoints (app/db/group_commit.py), by kind "
    "(start_attempt, record_success, step_done, complete_run, complete_with_step); 1 is a "
    "write that found no company.",
    ["kind"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024),
)
LEASE_LOSSES = Counter(
    "treadle_lease_losses_total", "Executions abandoned because their lease (fence) moved."
)
DB_RETRIES = Counter(
    "treadle_db_retries_total",
    "Write transactions re-run after a transient conflict, by fault (deadlock, "
    "serialization_failure, locked).",
    ["fault"],
)
DB_FAULTS = Counter(
    "treadle_db_faults_total",
    "Transient database faults that ended a request (503) or released a worker's run, by "
    "fault (unavailable, pool_timeout, statement_timeout, deadlock, serialization_failure, "
    "locked).",
    ["fault"],
)
HEARTBEATS_FAILED = Counter(
    "treadle_heartbeats_failed_total", "Worker heartbeats that could not reach the database."
)
WORKER_SLOTS = Gauge(
    "treadle_worker_slots", "Execution slots of this worker process, busy or free.", ["state"]
)
RUNS_BY_STATUS = Gauge(
    "treadle_runs",
    "Runs in the database by status (queue depth; refreshed at most every few seconds).",
    ["status"],
)
DEAD_LETTERS_PENDING = Gauge(
    "treadle_dead_letters_pending", "Dead letters waiting for an operator."
)
HTTP_REQUESTS = Counter(
    "treadle_http_requests_total",
    "HTTP requests by method, route template and status.",
    ["method", "route", "status"],
)
HTTP_DURATION = Histogram(
    "treadle_http_request_duration_seconds",
    "HTTP request latency by method and route.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 30),
)
SCHEDULE_FIRES = Counter(
    "treadle_schedule_fires_total",
    "Schedule ticks fired, by workflow and outcome (started, skipped, buffered, failed).",
    ["workflow", "outcome"],
)
SCHEDULE_FIRES_REFUSED = Counter(
    "treadle_schedule_fires_refused_total",
    "Schedule ticks that started no run because the principal the schedule acts for may "
    "no longer act, by cause (api_key_revoked, tenant_suspended).",
    ["cause"],
)
SCHEDULE_TICKS_MISSED = Counter(
    "treadle_schedule_ticks_missed_total",
    "Schedule ticks skipped because they were older than the catch-up window.",
    ["workflow"],
)
RUNS_BLOCKED = Gauge(
    "treadle_runs_blocked",
    "Open runs whose pinned workflow version no live worker has registered, by workflow.",
    ["workflow"],
)
DB_POOL_SIZE = Gauge(
    "treadle_db_pool_size_connections",
    "Connections each database pool of this process may open, by pool (main, read: "
    "SQLite readers, lease: heartbeats and lease releases, replica: reads that may lag on "
    "TREADLE_READ_DATABASE_URL).",
    ["pool"],
)
DB_POOL_IN_USE = Gauge(
    "treadle_db_pool_in_use_connections",
    "Pooled database connections checked out right now, by pool.",
    ["pool"],
)
DB_POOL_WAITING = Gauge(
    "treadle_db_pool_waiting_checkouts",
    "Callers waiting for a pooled database connection right now, by pool (above zero for "
    "long: the pool is saturated; past TREADLE_DB_POOL_TIMEOUT_SECONDS they fail).",
    ["pool"],
)
DB_POOL_WAIT = Histogram(
    "treadle_db_pool_wait_seconds",
    "Time to get a pooled database connection (queueing, plus connecting a new one), by pool.",
    ["pool"],
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30),
)
DB_REPLICA_FALLBACKS = Counter(
    "treadle_db_replica_fallbacks_total",
    "Reads that may lag served by the primary although TREADLE_READ_DATABASE_URL is set, "
    "by reason (unavailable: the replica could not be reached; lagging: it was further "
    "behind than TREADLE_READ_MAX_LAG_SECONDS, or its lag could not be told).",
    ["reason"],
)
DB_REPLICA_LAG = Gauge(
    "treadle_db_replica_lag_seconds",
    "How far the read replica trails the primary when last measured: the age of the "
    "newest heartbeat the primary wrote that the replica has applied (below a second on "
    "a standby that streams, idle or not; it grows while replay is paused or the standby "
    "is cut off from the primary; -1: unknown, no heartbeat reached the replica; NaN: the "
    "replica could not be reached at the last try).",
)
DB_REPLICA_IN_RECOVERY = Gauge(
    "treadle_db_replica_in_recovery",
    "1 while the server TREADLE_READ_DATABASE_URL names is a standby (in recovery), 0 "
    "when it is a primary (a promoted standby after a failover, or the URL names one): "
    "reads it serves are then correct but offload nothing; as last measured.",
)
DB_REPLICA_UP = Gauge(
    "treadle_db_replica_up",
    "1 while the read replica serves the reads that may lag, 0 while they go to the "
    "primary (unreachable or lagging); absent without TREADLE_READ_DATABASE_URL.",
)
