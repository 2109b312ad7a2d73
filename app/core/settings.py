"""Process settings read from ``TREADLE_*`` environment variables (pydantic-settings).

Settings are built once per process by its composition root (``create_app``,
``run_worker``, the CLI) and passed down; nothing reads the environment at import time.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from importlib.util import find_spec
from pathlib import Path
from typing import Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path(".treadle")


class AuthMode(StrEnum):
    """How bearer tokens are verified.

    ``dev``: HS256 tokens minted locally by ``treadle token`` with a shared secret.
    ``jwt``: tokens from an identity provider, verified against its JWKS (RS256, ES256,
    Ed25519 by default). In both modes per-tenant API keys (``trd_…``) are accepted too.
    """

    DEV = "dev"
    JWT = "jwt"


class LogFormat(StrEnum):
    """Log renderer: ``json`` for production, ``console`` for a terminal."""

    JSON = "json"
    CONSOLE = "console"


class TracebackMode(StrEnum):
    """What a run's and a step's ``error.traceback`` shows (docs/adr/0025-user-frames-only.md).

    ``user``: only the frames of the user's code, paths relative (app/core/tracebacks.py).
    ``full``: Python's whole traceback, Treadle's frames and absolute paths included, for
    deployments whose every API client may see the worker's internals.
    """

    USER = "user"
    FULL = "full"


class DbPooler(StrEnum):
    """What stands between Treadle and PostgreSQL (docs/deployment.md, "Behind PgBouncer").

    ``none``: direct connections (or a session-mode pooler): prepared statements are
    cached per connection and ``statement_timeout`` is a startup parameter.
    ``transaction``: a transaction-mode pooler such as PgBouncer, which hands a server
    connection to a client for one transaction only: no prepared statement outlives its
    statement, no startup parameters beyond PgBouncer's own, and LISTEN goes over
    ``TREADLE_LISTEN_DATABASE_URL`` (docs/adr/0032-transaction-pooler.md).
    """

    NONE = "none"
    TRANSACTION = "transaction"


class Settings(BaseSettings):
    """All tunables of an API or worker process.

    Every field maps to ``TREADLE_<FIELD>`` (e.g. ``TREADLE_DATABASE_URL``). Durations are
    in seconds (floats allowed). Invalid values raise ``pydantic.ValidationError`` naming
    the variable; the CLI turns that into a one-line message and exit code 2.
    """

    model_config = SettingsConfigDict(env_prefix="TREADLE_", extra="ignore", frozen=True)

    database_url: str = Field(
        default="",
        description="SQLAlchemy async URL: postgresql+asyncpg://… or sqlite+aiosqlite:///path; "
        "default: SQLite at <data_dir>/treadle.db.",
    )
    db_pool_size: int = Field(default=10, ge=1, le=200, description="Connections per process.")
    db_pool_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="How long a request or checkpoint waits for a free pooled connection; "
        "then the API answers 503 database_busy (Retry-After) and a worker releases the run.",
    )
    db_statement_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="PostgreSQL statement_timeout of every pooled connection; a statement "
        "cancelled by it answers 503 database_timeout (Retry-After) in the API and releases "
        "the run in a worker.",
    )
    db_retry_attempts: int = Field(
        default=4,
        ge=1,
        le=20,
        description="Attempts of a write transaction that hit a deadlock (SQLSTATE 40P01), a "
        "serialization failure (40001) or a locked SQLite database, with jittered "
        "exponential backoff between them; 1 disables the retry. When they run out the API "
        "answers 503 database_conflict (Retry-After).",
    )
    sqlite_busy_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    db_start_timeout_seconds: float = Field(
        default=60.0,
        ge=0,
        le=86400,
        description="How long `treadle serve`, `treadle worker` and the database commands "
        "(`migrate`, `api-keys`, `tenants`, `maintenance`) wait for an unreachable "
        "database at start (retrying with backoff, one warning per attempt) before they "
        "exit 1 with one line naming the error; 0: try once (docs/operations.md, "
        '"Start-up without a database").',
    )
    read_database_url: str = Field(
        default="",
        description="PostgreSQL streaming replica (hot standby) for reads that may lag: run "
        "lists, counts, reports, per-run step/event/log pages and the /metrics gauges "
        "(docs/adr/0033-lag-tolerant-reads-on-a-replica.md). Unset: everything reads the "
        "primary. A replica that is unreachable, or further behind than "
        "TREADLE_READ_MAX_LAG_SECONDS, is skipped: those reads go to the primary.",
    )
    read_max_lag_seconds: float = Field(
        default=30.0,
        gt=0,
        le=86400,
        description="How far behind the primary the replica may be (seconds: the age on "
        "the replica of a heartbeat the API writes on the primary every second, or every "
        "half bound if shorter; measured at most once a second) before its reads go to the "
        "primary. A replica cut off from the primary, or whose replay is paused, falls "
        "behind by this measure although it has nothing left to replay.",
    )
    db_pooler: DbPooler = Field(
        default=DbPooler.NONE,
        description="`transaction` when TREADLE_DATABASE_URL is a transaction-mode pooler "
        "(PgBouncer pool_mode=transaction): statements are not kept prepared, "
        "statement_timeout is not sent at connect (set it on the role: docs/deployment.md), "
        "and workers LISTEN over TREADLE_LISTEN_DATABASE_URL. Costs a round trip per "
        "statement, so leave it `none` on direct connections.",
    )
    listen_database_url: str = Field(
        default="",
        description="A direct PostgreSQL connection (postgresql+asyncpg://…) for each "
        "worker's LISTEN, which needs a session of its own; default: TREADLE_DATABASE_URL, "
        "or, with TREADLE_DB_POOLER=transaction, none (workers then only poll, every "
        "TREADLE_POLL_INTERVAL_SECONDS).",
    )

    auth_mode: AuthMode = AuthMode.DEV
    dev_secret: str | None = Field(
        default=None,
        min_length=32,
        description="HS256 secret for dev tokens; default: generated once in .treadle/dev-secret.",
    )
    data_dir: Path = Field(default=DEFAULT_DATA_DIR, description="Local state for dev mode.")

    jwt_issuer: str | None = Field(default=None, description="Required `iss` (jwt mode).")
    jwt_audience: str | None = Field(default=None, description="Required `aud` (jwt mode).")
    jwt_jwks_url: str | None = Field(default=None, description="JWKS URL of the provider.")
    jwt_jwks_file: Path | None = Field(default=None, description="JWKS JSON file instead.")
    jwt_algorithms: list[str] = Field(
        default=["RS256", "ES256", "Ed25519"],
        description="Allowed `alg` values; `none` and HS* are always refused. Ed25519 is the "
        "RFC 9864 name of EdDSA over Ed25519; the older `EdDSA` may be listed explicitly.",
    )
    jwt_leeway_seconds: int = Field(default=60, ge=0, le=600)
    jwt_tenant_claim: str = "tenant"
    jwt_scope_claim: str = "scope"
    jwt_groups_claim: str = "groups"
    jwks_refresh_min_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="Least time between two JWKS fetches (unknown `kid` triggers one).",
    )
    jwks_refresh_interval_seconds: float = Field(
        default=900.0,
        ge=0,
        le=86400,
        description="Interval of the background JWKS refresh of a URL or OIDC issuer, so a "
        "key the provider rotated in is known before the first token signed by it "
        "arrives (0: no background refresh; an unknown `kid` still triggers one).",
    )
    oidc_issuer: str | None = Field(
        default=None,
        description="OpenID Connect issuer URL: its `/.well-known/openid-configuration` "
        "gives the JWKS (instead of TREADLE_JWT_JWKS_URL) and the console's sign-in "
        "endpoints. Also the default of TREADLE_JWT_ISSUER.",
    )
    oidc_client_id: str | None = Field(
        default=None, description="Client id of the console's OIDC sign-in (enables it)."
    )
    oidc_client_secret: str | None = Field(
        default=None,
        description="Client secret of the console's OIDC sign-in (none: a public client, "
        "PKCE only).",
    )
    oidc_redirect_url: str | None = Field(
        default=None,
        description="Redirect URL registered at the provider; default: the console's "
        "`<external base>/ui/login/oidc/callback`.",
    )
    oidc_scopes: list[str] = Field(
        default=["openid", "profile", "email"],
        description="Scopes asked at sign-in (`openid` is always added).",
    )
    oidc_provider_name: str = Field(
        default="single sign-on",
        min_length=1,
        description="Shown on the console's login page as 'Sign in with <name>'.",
    )
    tenant_cache_seconds: float = Field(
        default=2.0,
        ge=0,
        le=300,
        description="How long an API process may reuse its list of suspended tenants before "
        "reading it again (0: read on every request). A suspension or resume made through "
        "another process takes effect on this one's requests within this window; workers "
        "always check at each attempt.",
    )

    auth_cache_size: int = Field(
        default=10_000,
        ge=0,
        le=1_000_000,
        description="Most verified bearer tokens (JWTs, dev tokens, API keys) an API process "
        "remembers, keyed by their SHA-256, least recently used evicted first (0: verify every "
        "request).",
    )
    auth_cache_ttl_seconds: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="Longest an API process trusts a token it verified before verifying it "
        "again (0: verify every request); never past the token's `exp`. An API key revoked "
        "through another process or the CLI is refused by this one within this window; "
        "revoked through this process, at once.",
    )
    auth_recheck_seconds: float = Field(
        default=5.0,
        ge=0.05,
        le=300,
        description="Longest an open long-lived response (an event stream, a result "
        "long-poll) keeps serving before it authenticates its bearer token again, as a new "
        "request would: an API key revoked or a tenant suspended through another process or "
        "the CLI ends it within this many seconds plus the cache windows above; through "
        "this process, at its next poll. A token's expiry ends it at once, whatever this "
        "says.",
    )

    max_payload_bytes: int = Field(
        default=1_048_576, ge=1024, le=64 * 1_048_576, description="Ceiling on one JSON payload."
    )
    max_batch_runs: int = Field(
        default=1000,
        ge=1,
        le=10_000,
        description="Most runs one `POST /runs:batch` may submit; more is 422 for the whole "
        "request (the body also stays under the request body ceiling, "
        "TREADLE_MAX_PAYLOAD_BYTES plus 64 KiB).",
    )
    max_header_bytes: int = Field(
        default=65_536,
        ge=4096,
        le=1_048_576,
        description="Ceiling on a request's line plus headers (bytes); larger requests get "
        "400 and the connection is closed before the app sees them (uvicorn's h11 parser, "
        "h11_max_incomplete_event_size).",
    )
    header_read_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="How long a client may take to send a request's line and headers, "
        "from its first byte (or from opening the connection); then the server answers "
        "408 and closes the connection (slowloris). `treadle serve` and `treadle dev`.",
    )
    body_read_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="How long a client may take to send a request's body once its headers "
        "are in; then 408 request_timeout and the connection is closed. At the default "
        "payload limit this asks for about 36 KB/s.",
    )
    max_steps_per_run: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="Ceiling on journaled steps (steps, waits, children, values) of one run; "
        "the next new step fails the run (error type CeilingExceeded).",
    )
    max_attempts_per_step: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Ceiling on attempts of one step, lost ones included, whatever its "
        "RetryPolicy says; the step then fails (failure_attempts_exhausted).",
    )
    max_events_per_run: int = Field(
        default=100_000,
        ge=100,
        le=100_000_000,
        description="Ceiling on a run's timeline rows, counted when a worker resumes the run; "
        "a run over it fails at its next new step (error type CeilingExceeded).",
    )
    run_log_max_lines: int = Field(
        default=1_000,
        ge=1,
        le=1_000_000,
        description="Ceiling on the ctx.logger lines kept with one run; later lines are "
        "counted in one 'N lines dropped' line instead (docs/adr/0027-run-logs.md).",
    )
    run_log_max_line_bytes: int = Field(
        default=4_096,
        ge=256,
        le=1_048_576,
        description="Ceiling on one ctx.logger line's message (characters) and, separately, "
        "its fields' JSON (bytes); a longer message is cut with a marker, larger fields are "
        "replaced by a preview.",
    )
    max_signals_buffered_per_run: int = Field(
        default=1_000,
        ge=1,
        le=1_000_000,
        description="Ceiling on signals sent to a run and not yet consumed; further signals "
        "are refused (422, code ceiling_exceeded) until the run consumes some.",
    )
    max_children_per_run: int = Field(
        default=1_000,
        ge=1,
        le=1_000_000,
        description="Ceiling on child runs one run may start; the next ctx.child fails the "
        "run (error type CeilingExceeded).",
    )
    # ctx.emit and the live event stream (docs/adr/0028-live-event-streams.md).
    emit_max_bytes: int = Field(
        default=16_384,
        ge=256,
        le=1_048_576,
        description="Ceiling on one ctx.emit: the JSON of its name and data (bytes); a larger "
        "emit raises EmitRefused in the calling code and nothing is kept.",
    )
    emit_max_per_run: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="Ceiling on the emitted events one run keeps, every attempt's emits "
        "counted; the next ctx.emit raises EmitRefused in the calling code.",
    )
    event_stream_heartbeat_seconds: float = Field(
        default=15.0,
        gt=0,
        le=300,
        description="Seconds between SSE comment lines on an idle GET /runs/{id}/events"
        "?follow=true stream (keeps proxies from closing it).",
    )
    event_stream_poll_seconds: float = Field(
        default=0.5,
        ge=0.01,
        le=30,
        description="Longest pause between two reads of a followed run's new events; a "
        "stream polls faster right after events arrived.",
    )
    event_stream_max_per_tenant: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Open event streams one tenant may hold on one API process; one more "
        "is answered 429 with Retry-After.",
    )

    compaction_after_days: float = Field(
        default=7.0,
        ge=0,
        le=36_500,
        description="Maintenance compaction: clear the payloads (input, output, step results, "
        "event data, signal and decision payloads) of runs finished more than this many days "
        "ago. This is the operational window: until then a run reads in full.",
    )
    archival_after_days: float = Field(
        default=30.0,
        ge=0,
        le=36_500,
        description="Maintenance archival: move runs finished more than this many days ago to "
        "runs_archive and drop their steps, events, signals, decisions and dead letters.",
    )
    audit_retention_days: float = Field(
        default=90.0,
        ge=0,
        le=36_500,
        description="Maintenance audit trimming: delete events and dead letters (of finished "
        "runs) older than this many days, and, by the same window, archived run summaries, "
        "final webhook deliveries, inbound events, finished batches, schedule fires and "
        "dead workers (docs/operations.md, retention table by table).",
    )
    run_count_limit: int = Field(
        default=1_000,
        ge=1,
        le=100_000_000,
        description="GET /runs/counts counts each status up to this many runs; a status "
        "with more reports this number and is listed in ``at_least`` (with "
        "``total_at_least`` true), so a count over a large share of a tenant stays a "
        "bounded index read (docs/adr/0020-run-labels.md).",
    )
    maintenance_batch_size: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description="Runs (or rows, for audit trimming) per maintenance transaction.",
    )
    partition_days: int = Field(
        default=7,
        ge=1,
        le=366,
        description="PostgreSQL time partitions (steps, events, runs_archive): days of run "
        "creation each new partition covers (docs/adr/0036-time-partitions.md). A change "
        "applies from the next partition maintenance creates.",
    )
    partitions_ahead_days: int = Field(
        default=14,
        ge=1,
        le=3_650,
        description="PostgreSQL time partitions: each maintenance run creates partitions "
        "until runs created this many days from now have one. Runs beyond it land in the "
        "default partition (kept, but moved on the next creation): run maintenance more "
        "often than this.",
    )

    max_lost_attempts: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Attempts of one step interrupted by a lost worker (kill -9, crash) that "
        "do not count against its retry budget; beyond this the step fails.",
    )
    step_start_record_after_seconds: float = Field(
        default=0.1,
        ge=0.0,
        le=3600.0,
        description="PostgreSQL: a step attempt's start record is written with its result "
        "(one commit per step) unless the attempt runs longer than this, emits, or fails; "
        "0 writes it before every attempt, as SQLite always does "
        "(docs/adr/0040-one-commit-per-step.md).",
    )
    step_result_hold_seconds: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="A plain step's result is held while the workflow's own code runs on "
        "after it, and written with the run's next write (the next step, a wait, the "
        "outcome: a run's last step commits with its completion), or alone once held "
        "this long; 0 writes every result before the workflow resumes "
        "(docs/adr/0047-held-step-results.md).",
    )
    lease_ttl_seconds: float = Field(default=30.0, ge=1.0, le=3600.0)
    heartbeat_interval_seconds: float = Field(default=10.0, gt=0.0)
    poll_interval_seconds: float = Field(default=1.0, ge=0.01, le=60.0)
    notify_coalesce_ms: float = Field(
        default=2.0,
        ge=0.0,
        le=1000.0,
        description="Window in which one process folds its submits' worker wake-ups into one "
        "NOTIFY, sent after commit (docs/adr/0037-coalesced-wake-ups.md); 0 still sends at "
        "most one at a time.",
    )
    group_commit_window_ms: float = Field(
        default=1.0,
        ge=-1.0,
        le=1000.0,
        description="PostgreSQL: how long a worker process collects its runs' plain "
        "checkpoints (a step's start and result, a bare completion) to send them as one "
        "statement and one commit, while another batch is in flight (else at once), "
        "each row fenced on its own "
        "(docs/adr/0039-group-commit.md); 0 takes only what arrives in the same event-loop "
        "turn; -1 (any negative value) turns group commit off: one statement per write.",
    )
    group_commit_max_rows: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="Rows of one kind that send a group commit at once, before its window "
        "ends (docs/adr/0039-group-commit.md).",
    )
    analyze_interval_seconds: float = Field(
        default=1.0,
        ge=0.0,
        le=3600.0,
        description="PostgreSQL: how often each API and worker process checks for Treadle "
        "tables that changed by more rows since their last ANALYZE than they held then, and "
        "analyzes them (one process at a time), so a database filled from empty does not "
        "keep the plans of its first seconds until autovacuum's next minute "
        "(docs/adr/0043-statistics-of-a-young-database.md, "
        "docs/adr/0048-statistics-checked-every-second.md); 0 turns it off.",
    )
    worker_concurrency: int = Field(default=16, ge=1, le=1000)
    batch_chunk_size: int = Field(
        default=100,
        ge=1,
        le=5000,
        description="Runs a bulk-action batch acts on per transaction (each chunk commits its "
        "actions with the batch's progress; docs/adr/0023-durable-batches.md).",
    )
    batch_max_runs: int = Field(
        default=100_000,
        ge=1,
        le=10_000_000,
        description="Most runs one bulk-action batch may match; a filter matching more is "
        "refused (422) so one request cannot snapshot an unbounded set.",
    )
    drain_grace_seconds: float = Field(default=30.0, ge=0.0, le=3600.0)
    inline_retry_max_seconds: float = Field(
        default=5.0,
        ge=0.0,
        le=60.0,
        description="Retries due sooner than this wait in the worker; later ones release the run.",
    )
    scheduler_enabled: bool = Field(
        default=True, description="Run the schedule-firing loop in worker processes."
    )
    scheduler_interval_seconds: float = Field(
        default=1.0, ge=0.01, le=60.0, description="How often a scheduler loop looks for due ticks."
    )

    webhook_allow_private: bool = Field(
        default=False,
        description="Let webhook targets resolve to addresses that are not globally routable "
        "(private, loopback, link-local, site-local, reserved, and IPv6 forms carrying such "
        "an IPv4 address): for local receivers and tests; the SSRF guard refuses them by "
        "default (docs/security.md).",
    )
    webhook_timeout_seconds: float = Field(
        default=10.0,
        gt=0.0,
        le=120.0,
        description="Deadline of one webhook POST (connect, send, read the status).",
    )
    webhook_max_attempts: int = Field(
        default=12,
        ge=1,
        le=100,
        description="POSTs of one delivery before it is final `failed`.",
    )
    webhook_retry_delay_seconds: float = Field(
        default=10.0,
        ge=0.0,
        le=3600.0,
        description="Base of a delivery's exponential backoff: delay x 2^(n-1) after the "
        "n-th failed POST, jittered by up to 20%.",
    )
    webhook_retry_max_delay_seconds: float = Field(
        default=3600.0,
        ge=0.0,
        le=86400.0,
        description="Longest wait between two POSTs of one delivery.",
    )
    webhook_concurrency: int = Field(
        default=8,
        ge=1,
        le=200,
        description="Deliveries one worker sends at once.",
    )

    console_secret: str | None = Field(
        default=None,
        min_length=32,
        description="Server secret of the browser console's sessions: each session's "
        "token is encrypted under a key derived from it and the session cookie. Required "
        "for the console outside dev auth mode (without it the console answers 503 and the "
        "API works as before); in dev mode, default: generated once in "
        "<data_dir>/console-secret.",
    )
    console_idle_timeout_seconds: float = Field(
        default=1800.0,
        ge=60,
        le=7 * 86_400,
        description="A console session unused for this long ends (sign in again).",
    )
    console_absolute_timeout_seconds: float = Field(
        default=43_200.0,
        ge=60,
        le=30 * 86_400,
        description="A console session ends this long after sign-in, however active.",
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    ssl_certfile: Path | None = Field(
        default=None,
        description="PEM certificate (chain) file: `treadle serve` and `treadle dev` then "
        "serve https themselves (uvicorn's ssl_certfile); needs TREADLE_SSL_KEYFILE. The "
        "console's cookies get the `__Host-` prefix on https (docs/console.md).",
    )
    ssl_keyfile: Path | None = Field(
        default=None,
        description="PEM private key of TREADLE_SSL_CERTFILE (uvicorn's ssl_keyfile).",
    )
    forwarded_allow_ips: str = Field(
        default="127.0.0.1,::1",
        description="Comma-separated addresses or CIDR networks of the reverse proxies "
        "trusted to say the client's scheme and address (X-Forwarded-Proto, "
        "X-Forwarded-For; uvicorn's forwarded_allow_ips), or `*` for any peer. A request "
        "with X-Forwarded-Proto: https from one of them is https to the console (Secure, "
        "`__Host-` cookies); from any other peer the headers are ignored. Default: this "
        "machine only (docs/deployment.md).",
    )
    log_format: LogFormat = LogFormat.CONSOLE
    log_level: str = "INFO"
    # The per-attempt lines (step started / finished) alone: turn them down on a busy
    # worker while retries, waits, releases and finishes stay (app/engine/story_log.py).
    # None: the same as log_level.
    step_log_level: str | None = None
    error_tracebacks: TracebackMode = Field(
        default=TracebackMode.USER,
        description="What a run's and a step's error.traceback shows to API clients: "
        "`user` (the step's own frames, relative paths) or `full` (every frame, absolute "
        "paths). The worker's log always gets the full traceback.",
    )

    @field_validator("log_level", "step_log_level")
    @classmethod
    def _known_level(cls, value: str | None) -> str | None:
        # A typo must not silently log everything or nothing.
        known = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        if value is None:
            return None
        if value.upper() not in known:
            raise ValueError(f"not a log level: {value!r} (one of {', '.join(known)})")
        return value.upper()

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxy_addresses(cls, value: str) -> str:
        # uvicorn would take a typo as a literal host name that no peer ever matches, so
        # a proxy's https would silently not count: name the bad entry instead.
        entries = [e.strip() for e in value.split(",") if e.strip()]
        if not entries:
            raise ValueError("give at least one address or network, or `*`")
        for entry in entries:
            if entry == "*":
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"not an IP address or CIDR network: {entry!r} (e.g. 10.0.0.5, "
                    "10.0.0.0/24, ::1, or * for any peer)"
                ) from None
        return ",".join(entries)

    @model_validator(mode="after")
    def _check_tls(self) -> Self:
        # One without the other cannot serve https; a missing file is named here rather
        # than in uvicorn's traceback at start.
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError(
                "TREADLE_SSL_CERTFILE and TREADLE_SSL_KEYFILE go together: give both or neither"
            )
        for name, path in (("CERTFILE", self.ssl_certfile), ("KEYFILE", self.ssl_keyfile)):
            if path is not None and not path.is_file():
                raise ValueError(f"TREADLE_SSL_{name}: no such file: {path}")
        return self

    @field_validator("database_url", "read_database_url", "listen_database_url")
    @classmethod
    def _async_driver(cls, value: str) -> str:
        return normalize_database_url(value)

    @model_validator(mode="after")
    def _default_database(self) -> Self:
        if not self.database_url:
            # Frozen model: set once, during validation.
            object.__setattr__(
                self, "database_url", f"sqlite+aiosqlite:///{self.data_dir / 'treadle.db'}"
            )
        return self

    @model_validator(mode="after")
    def _check_driver(self) -> Self:
        # asyncpg is the treadle[postgres] extra (docs/adr/0014-packaging.md): without it,
        # say which install is missing instead of a traceback from SQLAlchemy's dialect.
        if self.database_url.startswith("postgresql") and find_spec("asyncpg") is None:
            raise ValueError(
                "TREADLE_DATABASE_URL is a PostgreSQL database, but its driver (asyncpg) "
                "is not installed: install treadle[postgres]"
            )
        return self

    @model_validator(mode="after")
    def _check_read_database(self) -> Self:
        # A replica of SQLite does not exist; a SQLite URL here is a mistake, not a choice.
        if self.read_database_url and not (
            self.read_database_url.startswith("postgresql")
            and self.database_url.startswith("postgresql")
        ):
            raise ValueError(
                "TREADLE_READ_DATABASE_URL needs PostgreSQL for both it and "
                "TREADLE_DATABASE_URL (a streaming replica of the primary)"
            )
        if self.read_database_url and _same_server(self.read_database_url, self.database_url):
            # Not harmless: every lag-tolerant read would pay a second pool and a lag
            # probe against the primary itself, and the operator believes reads are
            # offloaded when they are not.
            raise ValueError(
                "TREADLE_READ_DATABASE_URL is the same database as TREADLE_DATABASE_URL: "
                "set it to the streaming replica (hot standby), or unset it to read the "
                "primary"
            )
        return self

    @model_validator(mode="after")
    def _check_pooler(self) -> Self:
        # A pooler setting on SQLite is a mistake worth naming, not a no-op to ignore.
        if self.db_pooler != DbPooler.NONE and not self.database_url.startswith("postgresql"):
            raise ValueError("TREADLE_DB_POOLER is for PostgreSQL: TREADLE_DATABASE_URL is not")
        if self.listen_database_url and not self.listen_database_url.startswith("postgresql"):
            raise ValueError("TREADLE_LISTEN_DATABASE_URL must be a postgresql+asyncpg:// URL")
        return self

    @model_validator(mode="after")
    def _check_jwt(self) -> Self:
        if self.oidc_issuer and not self.jwt_issuer:
            # The issuer's tokens carry its URL as `iss` (OIDC Discovery 1.0, section 4.3).
            object.__setattr__(self, "jwt_issuer", self.oidc_issuer)
        if self.oidc_issuer and (self.jwt_jwks_url or self.jwt_jwks_file):
            raise ValueError(
                "TREADLE_OIDC_ISSUER gives the JWKS by discovery: unset TREADLE_JWT_JWKS_URL "
                "and TREADLE_JWT_JWKS_FILE (one source of keys, not two)"
            )
        if self.oidc_client_id and not (self.oidc_issuer and self.auth_mode == AuthMode.JWT):
            raise ValueError(
                "TREADLE_OIDC_CLIENT_ID (the console's OIDC sign-in) needs TREADLE_AUTH_MODE=jwt "
                "and TREADLE_OIDC_ISSUER: the API must accept the tokens the provider issues"
            )
        if self.auth_mode == AuthMode.JWT:
            missing = [
                name
                for name, value in (
                    ("TREADLE_JWT_ISSUER", self.jwt_issuer),
                    ("TREADLE_JWT_AUDIENCE", self.jwt_audience),
                )
                if not value
            ]
            if not (self.jwt_jwks_url or self.jwt_jwks_file or self.oidc_issuer):
                missing.append(
                    "TREADLE_OIDC_ISSUER (or TREADLE_JWT_JWKS_URL or TREADLE_JWT_JWKS_FILE)"
                )
            if missing:
                raise ValueError("TREADLE_AUTH_MODE=jwt needs " + ", ".join(missing))
        bad = [a for a in self.jwt_algorithms if a.lower() == "none" or a.upper().startswith("HS")]
        if bad:
            raise ValueError(
                f"TREADLE_JWT_ALGORITHMS may not contain {bad}: symmetric or "
                "unsigned algorithms are refused"
            )
        return self

    @model_validator(mode="after")
    def _check_lease_timing(self) -> Self:
        # A heartbeat must land at least twice per TTL or a single slow beat loses the lease.
        if self.heartbeat_interval_seconds >= self.lease_ttl_seconds / 2:
            raise ValueError(
                "TREADLE_HEARTBEAT_INTERVAL_SECONDS must be less than half of "
                f"TREADLE_LEASE_TTL_SECONDS ({self.heartbeat_interval_seconds} >= "
                f"{self.lease_ttl_seconds}/2)"
            )
        if self.poll_interval_seconds >= self.lease_ttl_seconds:
            raise ValueError(
                "TREADLE_POLL_INTERVAL_SECONDS must be less than TREADLE_LEASE_TTL_SECONDS"
            )
        return self

    @model_validator(mode="after")
    def _check_retention(self) -> Self:
        # Runs stay whole for the operational window; shorter audit or archival windows
        # would delete what operators are promised they can still read.
        if self.audit_retention_days < self.compaction_after_days:
            raise ValueError(
                f"TREADLE_AUDIT_RETENTION_DAYS ({self.audit_retention_days:g}) is shorter than "
                f"the operational window TREADLE_COMPACTION_AFTER_DAYS "
                f"({self.compaction_after_days:g}): audit records must outlive it"
            )
        if self.archival_after_days < self.compaction_after_days:
            raise ValueError(
                f"TREADLE_ARCHIVAL_AFTER_DAYS ({self.archival_after_days:g}) is shorter than "
                f"the operational window TREADLE_COMPACTION_AFTER_DAYS "
                f"({self.compaction_after_days:g})"
            )
        return self

    @property
    def is_sqlite(self) -> bool:
        """True when the database URL names SQLite (the embedded default)."""
        return self.database_url.startswith("sqlite")

    @property
    def listen_url(self) -> str | None:
        """The URL workers LISTEN on, or None when they only poll.

        ``TREADLE_LISTEN_DATABASE_URL`` when set; else the main URL, unless that is a
        transaction pooler, where a LISTEN would hold one server connection's session
        that the pooler hands to other clients after the statement (so notifications
        reach nobody), or SQLite, which has no LISTEN.
        """
        if self.listen_database_url:
            return self.listen_database_url
        if self.is_sqlite or self.db_pooler == DbPooler.TRANSACTION:
            return None
        return self.database_url

    @property
    def auth_mode_explicit(self) -> bool:
        """True when ``TREADLE_AUTH_MODE`` (or the ``auth_mode`` argument) was given."""
        return "auth_mode" in self.model_fields_set

    def dev_auth_refusal(self) -> str | None:
        """Why dev-mode auth may not run with these settings, or None when it may.

        Dev tokens (``treadle token``) are HS256 tokens signed with one local secret that
        name any tenant and any scope: fit for a laptop, not for a shared database. So
        the default ``dev`` mode holds only on SQLite (the embedded default); anywhere
        else dev mode must be chosen explicitly with ``TREADLE_AUTH_MODE=dev``, and the
        production choice is ``jwt`` (docs/security.md, docs/deployment.md). Every
        process that verifies tokens (``treadle serve``, ``treadle dev``, ``treadle
        token``) refuses to start with this message.
        """
        if self.auth_mode != AuthMode.DEV or self.is_sqlite or self.auth_mode_explicit:
            return None
        from sqlalchemy.engine import make_url

        where = make_url(self.database_url).render_as_string(hide_password=True)
        return (
            f"TREADLE_AUTH_MODE is not set and the database is {where}: dev-mode tokens "
            "(one shared secret, any tenant, any scope) are the default only on the "
            "embedded SQLite database. Set TREADLE_AUTH_MODE=jwt with TREADLE_OIDC_ISSUER "
            "and TREADLE_JWT_AUDIENCE (or TREADLE_JWT_ISSUER and TREADLE_JWT_JWKS_URL) for "
            "your identity provider (per-tenant API keys work in every mode), or "
            "TREADLE_AUTH_MODE=dev explicitly for local testing only."
        )


# The drivers Treadle runs on (async SQLAlchemy dialects), by URL scheme as written.
_ASYNC_SCHEMES = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
}


def normalize_database_url(url: str) -> str:
    """``url`` with the async driver Treadle needs in its scheme.

    ``postgresql://`` and ``postgres://`` (libpq's and most providers' spelling) become
    ``postgresql+asyncpg://``; ``sqlite://`` becomes ``sqlite+aiosqlite://``; the rest of
    the URL is kept byte for byte. A URL naming another driver (``postgresql+psycopg``,
    ``sqlite+pysqlite``) or another database is refused: Treadle's SQL is async on
    asyncpg and aiosqlite only (docs/deployment.md, "Database URLs").

    Args:
        url: a SQLAlchemy URL as written in a ``TREADLE_*_DATABASE_URL``; "" stays "".

    Returns:
        The URL with an async scheme.

    Raises:
        ValueError: the scheme names a driver or database Treadle cannot use; the
            message says what to write instead.
    """
    if not url:
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(
            "not a database URL: write postgresql+asyncpg://user:password@host/db or "
            "sqlite+aiosqlite:///path"
        )
    normalized = _ASYNC_SCHEMES.get(scheme.lower())
    if normalized is None:
        base = scheme.split("+", 1)[0].lower()
        hint = {"postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}.get(
            base, "sqlite+aiosqlite" if base == "sqlite" else None
        )
        if hint is None:
            raise ValueError(
                f"unsupported database {scheme!r}: Treadle runs on PostgreSQL "
                "(postgresql+asyncpg://…) or SQLite (sqlite+aiosqlite:///…)"
            )
        raise ValueError(f"the {scheme!r} driver is not supported: write {hint}://…")
    return normalized + "://" + rest


def _same_server(a: str, b: str) -> bool:
    """True when two PostgreSQL URLs name the same hosts, ports and database."""
    from sqlalchemy.engine import make_url

    def key(url: str) -> tuple[object, ...]:
        u = make_url(url)
        host = u.query.get("host") or u.host or ""
        port = u.query.get("port") or u.port or 5432
        return (str(host).lower(), str(port), u.database)

    return key(a) == key(b)


def format_settings_error(exc: Exception) -> str:
    """Render a pydantic ``ValidationError`` from :class:`Settings` as lines naming variables.

    Args:
        exc: the error raised while building ``Settings()``.

    Returns:
        One line per invalid variable, e.g. ``TREADLE_PORT: Input should be … (got 'x')``.
    """
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return str(exc)
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        name = "TREADLE_" + loc[0].upper() if loc else "settings"
        msg = err.get("msg", "invalid")
        if "input" in err and loc and "secret" not in loc[0]:
            lines.append(f"{name}: {msg} (got {err['input']!r})")
        else:
            lines.append(f"{name}: {msg}" if loc else msg)
    return "\n".join(lines)
