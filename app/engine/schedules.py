"""Schedules: compute cron and one-off ticks, and fire each tick exactly once.

A schedule is a cron expression (5 fields, evaluated in an IANA time zone by ``cronsim``)
or a one-off time. Its row holds the next nominal tick and when that tick fires (tick plus
a deterministic jitter). Scheduler loops run in every worker process (and ``treadle
dev``); any number may run at once. A pass locks one due schedule, walks its ticks up to
"now" and, for each tick:

- older than the catch-up window: skipped and counted (``missed_count``);
- otherwise fired under the overlap policy, recording a ``schedule_fires`` row whose
  primary key ``(tenant_id, schedule_id, tick)`` makes the fire exactly-once however many
  loops race (``ON CONFLICT DO NOTHING``; the loser does nothing). The run is inserted in
  the same transaction, with the idempotency key ``schedule:<id>:<tick>`` as a second guard.

Every statement of a pass names the schedule's tenant, so it runs on the tenant-leading
keys (docs/adr/0034-tenant-leading-keys.md, revision 0024); only the search for due
schedules spans tenants.

The clock is injectable (:data:`Clock`): production uses the database clock; tests pass a
:class:`VirtualClock` to skip time. DST rules and the choice of ``cronsim`` are in
docs/adr/0005-schedules.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from importlib import resources
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog
from cronsim import CronSim, CronSimError
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json, metrics
from app.core.errors import Forbidden, InvalidInput, InvalidState, TreadleError
from app.core.ids import new_uuid7
from app.core.settings import Settings
from app.core.status import AccessPolicy
from app.db.database import Database, fetch_now
from app.db.queries import schedules as sched_q
from app.engine import authority, control
from app.engine.submit import SubmitRequest, Submitter, insert_prepared

log = structlog.get_logger("treadle.scheduler")

Clock = Callable[[], Awaitable[datetime]]
"""Returns "now" as an aware UTC datetime. Default: the database clock."""

MAX_CATCHUP_WINDOW_SECONDS = 366 * 86400
MAX_JITTER_SECONDS = 3600


class Overlap(StrEnum):
    """What a tick does while a run it started earlier is still open."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW_ALL = "allow_all"
    CANCEL_PREVIOUS = "cancel_previous"


class ScheduleState(StrEnum):
    """``active`` fires, ``paused`` does not, ``completed`` (a fired one-off) never will."""

    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"


class FireKind(StrEnum):
    """Where a tick came from."""

    CRON = "cron"
    ONCE = "once"
    MANUAL = "manual"


class FireOutcome(StrEnum):
    """What firing a tick did."""

    STARTED = "started"
    SKIPPED = "skipped"
    BUFFERED = "buffered"
    FAILED = "failed"


class VirtualClock:
    """A clock that only moves when told to: tests and simulations skip time with it.

    Args:
        start: the initial time (aware).
    """

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("VirtualClock needs an aware datetime")
        self.current = start.astimezone(UTC)

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds``; returns the new time."""
        self.current += timedelta(seconds=seconds)
        return self.current

    async def __call__(self) -> datetime:
        """The current virtual time."""
        return self.current


# --- tick arithmetic ------------------------------------------------------------------


@functools.cache
def _iana_names() -> frozenset[str]:
    # The list shipped with the tzdata package (a dependency): the IANA names only, the
    # same on every host, unlike available_timezones() which also lists host files.
    return frozenset(resources.files("tzdata").joinpath("zones").read_text().split())


def zone_of(timezone: str) -> ZoneInfo:
    """The IANA zone named ``timezone``.

    Only names of the IANA database are accepted (``Europe/Berlin``, ``UTC``), not host
    files such as ``localtime`` whose meaning depends on the machine.

    Raises:
        InvalidInput: not a zone of the IANA database (422).
    """
    try:
        if timezone not in _iana_names():
            raise ValueError(timezone)
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidInput(
            f"unknown time zone {timezone[:64]!r} (use an IANA name such as Europe/Berlin)",
            errors=[{"path": "timezone", "message": "not an IANA time zone"}],
        ) from None


# (name, how many values the field has): a step must lie between 1 and that count.
_CRON_FIELDS = (
    ("minute", 60),
    ("hour", 24),
    ("day-of-month", 31),
    ("month", 12),
    ("day-of-week", 7),
)
_MAX_CRON_NUMBER_DIGITS = 2


def _field_problem(fields: list[str]) -> str | None:
    """The first rule a 5-field cron expression breaks that ``cronsim`` lets through, or None.

    cronsim accepts any step (``*/99999999999999999999``, ``5/99``): a step larger than the
    field's count of values selects one value at most and is a typo, not an intent. It
    also parses numbers of any length. So: every number in a field has at most two digits,
    and every step is between 1 and the field's count of values (minute 60, hour 24,
    day-of-month 31, month 12, day-of-week 7). Ranges and values out of the field's range
    are left to cronsim, which refuses them.
    """
    for text, (name, count) in zip(fields, _CRON_FIELDS, strict=True):
        for digits in re.findall(r"[0-9]+", text):
            if len(digits) > _MAX_CRON_NUMBER_DIGITS:
                return f"bad cron expression: {name} field {text[:40]!r} has a number too large"
        for term in text.split(","):
            if "/" not in term:
                continue
            step = term.rsplit("/", 1)[1]
            if not step.isdigit() or not 1 <= int(step) <= count:
                return (
                    f"bad cron expression: the step in {name} field {text[:40]!r} must be a "
                    f"whole number from 1 to {count}"
                )
    return None


def check_timing(cron: str | None, timezone: str, at: datetime | None) -> None:
    """Validate a schedule's timing: exactly one of a 5-field cron or an aware ``at``.

    Raises:
        InvalidInput: both or neither given, a bad cron expression, one that never
            fires, an unknown time zone or a naive ``at`` (422, with the field's path).
    """
    zone = zone_of(timezone)
    if (cron is None) == (at is None):
        raise InvalidInput(
            "give exactly one of cron (recurring) or at (one-off)",
            errors=[{"path": "cron", "message": "exactly one of cron and at"}],
        )
    if at is not None:
        if at.tzinfo is None:
            raise InvalidInput(
                "at needs a timezone (e.g. 2027-01-01T09:00:00Z)",
                errors=[{"path": "at", "message": "naive datetime"}],
            )
        return
    assert cron is not None
    fields = cron.split()
    problem: str | None = None
    if len(fields) != 5:
        problem = "a cron expression has 5 fields: minute hour day-of-month month day-of-week"
    else:
        problem = _field_problem(fields)
    if problem is None:
        try:
            it = CronSim(" ".join(fields), datetime(2000, 1, 1, tzinfo=zone))
            next(it)
        except (CronSimError, ValueError) as exc:
            # ValueError: cronsim converts digits with int(), which refuses very long ones.
            problem = f"bad cron expression: {str(exc)[:120]}"
        except StopIteration:
            problem = "this cron expression never fires"
    if problem is not None:
        raise InvalidInput(problem, errors=[{"path": "cron", "message": problem}])


def next_tick(
    cron: str | None, timezone: str, at: datetime | None, after: datetime
) -> datetime | None:
    """The first tick strictly after ``after`` (UTC), or None if there is none.

    Cron ticks are computed in the schedule's zone by ``cronsim``, which follows Debian
    cron across DST changes (docs/adr/0005-schedules.md): a fixed time inside a
    spring-forward gap fires at the first instant after the gap; a fixed time inside a
    fall-back overlap fires once, at its first occurrence; wildcard-hour expressions
    follow elapsed time (every real hour, including the repeated one).

    The result is always strictly after ``after``, so a schedule created, resumed or
    re-timed at any instant never gets a first tick before it started counting. cronsim
    starts from the *wall time* of ``after`` and reads it as its first occurrence: inside
    the second pass through a repeated hour (``fold=1``) it would propose ticks of the
    first pass, already gone by the clock. Those are skipped, so the result is the first
    tick of the schedule's own tick chain that lies after ``after``
    (docs/adr/0005-schedules.md, rule 5).

    Raises:
        RuntimeError: cronsim yielded over :data:`_MAX_STALE_TICKS` ticks at or before
            ``after`` (not possible for a 5-field expression: a repeated hour holds at
            most 60 of them).
    """
    if cron is None:
        assert at is not None
        at = at.astimezone(UTC)
        return at if at > after else None
    after = after.astimezone(UTC)
    zone = ZoneInfo(timezone)
    ticks = CronSim(cron, _chain_anchor(after, zone))
    for _ in range(_MAX_STALE_TICKS):
        try:
            found = next(ticks).astimezone(UTC)
        except StopIteration:
            return None
        if found > after:
            return found
    raise RuntimeError(f"cron {cron!r} in {timezone}: no tick after {after.isoformat()}")


def _chain_anchor(after: datetime, zone: ZoneInfo) -> datetime:
    # cronsim reads its start's wall time as a first occurrence, so a start inside or just
    # before a repeated hour can put it on another chain than a long-running schedule's
    # (Pacific/Chatham, "45 */2": the fold's second 02:45). Starting from a wall time that
    # occurs exactly once, hours before (a DST shift is at most 2 h), walks the same chain
    # a schedule created days earlier walks; ticks up to ``after`` are then skipped.
    start = after - _ANCHOR_LEAD
    while True:
        local = start.astimezone(zone)
        if local.replace(fold=1 - local.fold).utcoffset() == local.utcoffset():
            return local
        start -= timedelta(hours=1)


_ANCHOR_LEAD = timedelta(hours=3)
# At most the minutes between the anchor and the start instant can lie behind it.
_MAX_STALE_TICKS = 20_000


def jitter_offset(schedule_id: uuid.UUID, tick: datetime, jitter_seconds: int) -> float:
    """Seconds a tick fires after its nominal time: in ``[0, jitter_seconds)``.

    Derived from a hash of the schedule id and the tick, so every process computes the
    same value and a replayed pass agrees with the first.
    """
    if jitter_seconds <= 0:
        return 0.0
    digest = hashlib.sha256(f"{schedule_id}:{tick.astimezone(UTC).isoformat()}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return round(fraction * jitter_seconds, 3)


def fire_time(row: RowMapping | dict[str, Any], tick: datetime) -> datetime:
    """When ``tick`` of this schedule fires: the tick plus its jitter."""
    return tick + timedelta(
        seconds=jitter_offset(row["schedule_id"], tick, int(row["jitter_seconds"]))
    )


def _next(row: RowMapping | dict[str, Any], after: datetime) -> datetime | None:
    return next_tick(row["cron"], row["timezone"], row["at"], after)


def upcoming(row: RowMapping, count: int) -> list[tuple[datetime, datetime]]:
    """The next ``count`` ``(tick, fire time)`` pairs of an active schedule."""
    out: list[tuple[datetime, datetime]] = []
    if row["state"] != ScheduleState.ACTIVE.value:
        return out
    tick = row["next_tick_at"]
    while tick is not None and len(out) < count:
        out.append((tick, fire_time(row, tick)))
        tick = _next(row, tick)
    return out


# --- creating and changing schedules ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule as the API (or a test) describes it.

    Attributes:
        name: unique within the tenant.
        workflow: registered workflow name.
        input: the JSON input of every run it starts.
        version: pin a definition version; None = the latest registered at each fire.
        cron: 5-field cron expression (recurring), or None with ``at``.
        timezone: IANA zone the cron expression is evaluated in.
        at: one-off fire time (aware), or None with ``cron``.
        overlap: policy while an earlier run is open.
        catchup_window_seconds: ticks later than this are skipped and counted.
        jitter_seconds: each tick fires up to this much later (deterministic per tick).
        paused: create paused.
    """

    name: str
    workflow: str
    input: Any = field(default_factory=dict)
    version: str | None = None
    cron: str | None = None
    timezone: str = "UTC"
    at: datetime | None = None
    overlap: Overlap = Overlap.SKIP
    catchup_window_seconds: int = 60
    jitter_seconds: int = 0
    paused: bool = False


def _timing_values(schedule_id: uuid.UUID, values: dict[str, Any], now: datetime) -> dict[str, Any]:
    tick = _next(values, now)
    if values["cron"] is None and values["at"] is not None:
        # A one-off may be created for a moment just past (within its catch-up window).
        tick = values["at"].astimezone(UTC)
    probe = {"schedule_id": schedule_id, "jitter_seconds": values["jitter_seconds"]}
    return {
        "next_tick_at": tick,
        "next_fire_at": None if tick is None else fire_time(probe, tick),
    }


async def _validate_run(
    submitter: Submitter, workflow: str, version: str | None, input: Any
) -> tuple[str, AccessPolicy]:
    # The input as JSON text, and the access policy of the version a fire would start now.
    input_text, resolved = await submitter.prepare(
        SubmitRequest(workflow=workflow, input=input, version=version)
    )
    return input_text, AccessPolicy(await submitter.access(workflow, resolved))


async def create_schedule(
    db: Database,
    submitter: Submitter,
    spec: ScheduleSpec,
    *,
    tenant_id: str,
    subject: str,
    api_key_id: uuid.UUID | None = None,
    now: datetime | None = None,
) -> RowMapping:
    """Create a schedule; its first tick is the first one after ``now`` (DB clock default).

    The schedule acts for its creator: ``subject`` and ``api_key_id`` (the API key the
    request used, None for a JWT) are stored, every run it starts carries them, and each
    fire re-checks them (app/engine/authority.py). Its ``access`` is its workflow's
    policy: an owner-policy workflow's schedule is visible to ``subject`` alone.

    Raises:
        InvalidInput: bad timing (see :func:`check_timing`), input invalid for the
            workflow's schema, or a one-off ``at`` already older than its catch-up window.
        WorkflowNotFound: the workflow (or pinned version) is not registered (404).
        ScheduleNameTaken: the tenant already has a schedule of this name (409).
    """
    check_timing(spec.cron, spec.timezone, spec.at)
    input_text, access = await _validate_run(submitter, spec.workflow, spec.version, spec.input)
    schedule_id = new_uuid7()
    values: dict[str, Any] = {
        "schedule_id": schedule_id,
        "tenant_id": tenant_id,
        "name": spec.name,
        "workflow": spec.workflow,
        "version": spec.version,
        "input": input_text,
        "cron": None if spec.cron is None else " ".join(spec.cron.split()),
        "timezone": spec.timezone,
        "at": None if spec.at is None else spec.at.astimezone(UTC),
        "overlap": Overlap(spec.overlap).value,
        "catchup_window_seconds": spec.catchup_window_seconds,
        "jitter_seconds": spec.jitter_seconds,
        "state": (ScheduleState.PAUSED if spec.paused else ScheduleState.ACTIVE).value,
        "created_by": subject,
        "api_key_id": api_key_id,
        "access": access.value,
    }

    async def create_tx(conn: AsyncConnection) -> RowMapping:
        current = now or await fetch_now(conn, db.dialect)
        _check_at(values, current)
        values.update(_timing_values(schedule_id, values, current))
        return await sched_q.insert_schedule(conn, values)

    return await db.write_retrying(create_tx, what="create schedule")


def _check_at(values: dict[str, Any], now: datetime) -> None:
    at = values["at"]
    if at is not None and at < now - timedelta(seconds=values["catchup_window_seconds"]):
        raise InvalidInput(
            "at is in the past (older than the catch-up window)",
            errors=[{"path": "at", "message": "in the past"}],
        )


_TIMING_FIELDS = {"cron", "timezone", "at", "jitter_seconds"}
_EDITABLE = {
    "name",
    "workflow",
    "version",
    "input",
    "cron",
    "timezone",
    "at",
    "overlap",
    "catchup_window_seconds",
    "jitter_seconds",
}


async def update_schedule(
    db: Database,
    submitter: Submitter,
    *,
    tenant_id: str,
    schedule_id: uuid.UUID,
    changes: dict[str, Any],
    owner: str | None = None,
    now: datetime | None = None,
) -> RowMapping:
    """Apply a partial update. Changing the timing recomputes the next tick from ``now``.

    Setting ``cron`` clears ``at`` and vice versa. ``input`` is a JSON value. The
    schedule keeps acting for its creator; its ``access`` follows the (new) workflow.

    Args:
        db: the database.
        submitter: validates the (new) workflow and input.
        tenant_id: the caller's tenant.
        schedule_id: the schedule.
        changes: the fields to change (a subset of the editable ones).
        owner: the caller's subject (None for admins): another subject's owner-policy
            schedule is not found, and pointing someone else's schedule at an
            owner-policy workflow is refused (it would start private work in their name).
        now: "now" for the next tick (default the database clock).

    Raises:
        ScheduleNotFound: not this tenant's schedule, or not visible to ``owner`` (404).
        Forbidden: the change makes another subject's schedule owner-policy (403).
        InvalidInput, WorkflowNotFound, ScheduleNameTaken: as for :func:`create_schedule`.
    """
    unknown = set(changes) - _EDITABLE
    if unknown:
        raise InvalidInput(
            f"cannot change {sorted(unknown)}",
            errors=[{"path": k, "message": "not editable"} for k in sorted(unknown)],
        )

    async def update_tx(conn: AsyncConnection) -> RowMapping:
        row = await sched_q.get_schedule(conn, tenant_id, schedule_id, lock=True, owner=owner)
        merged: dict[str, Any] = dict(row)
        merged["input"] = json.loads(row["input"])
        merged.update(changes)
        if changes.get("cron") is not None:
            merged["at"] = None if "at" not in changes else merged["at"]
        if changes.get("at") is not None:
            merged["cron"] = None if "cron" not in changes else merged["cron"]
        check_timing(merged["cron"], merged["timezone"], merged["at"])
        values = {k: merged[k] for k in _EDITABLE}
        values["input"], access = await _validate_run(
            submitter, merged["workflow"], merged["version"], merged["input"]
        )
        if access == AccessPolicy.OWNER and owner is not None and owner != row["created_by"]:
            raise Forbidden(
                f"workflow {merged['workflow']!r} is owner-policy: only the schedule's creator "
                "may point it there, since its runs are started in the creator's name"
            )
        values["access"] = access.value
        if values["cron"] is not None:
            values["cron"] = " ".join(values["cron"].split())
        if values["at"] is not None:
            values["at"] = values["at"].astimezone(UTC)
        values["overlap"] = Overlap(values["overlap"]).value
        if _TIMING_FIELDS & set(changes) and row["state"] != ScheduleState.COMPLETED.value:
            current = now or await fetch_now(conn, db.dialect)
            _check_at(values, current)
            values.update(
                _timing_values(schedule_id, {**values, "schedule_id": schedule_id}, current)
            )
        elif row["state"] == ScheduleState.COMPLETED.value and {"at", "cron"} & set(changes):
            # Re-arming a fired one-off (new time, or now recurring) makes it active again.
            current = now or await fetch_now(conn, db.dialect)
            _check_at(values, current)
            values.update(
                _timing_values(schedule_id, {**values, "schedule_id": schedule_id}, current)
            )
            values["state"] = ScheduleState.ACTIVE.value
        return await sched_q.update_schedule(conn, tenant_id, schedule_id, values)

    return await db.write_retrying(update_tx, what="update schedule")


async def set_paused(
    db: Database,
    *,
    tenant_id: str,
    schedule_id: uuid.UUID,
    paused: bool,
    owner: str | None = None,
    now: datetime | None = None,
) -> RowMapping:
    """Pause or resume. Idempotent. Resuming skips the ticks that fell in the pause.

    Ticks while paused are neither fired nor counted as missed: the next tick after
    resuming is the first one after ``now`` (a one-off keeps its ``at``; if that passed
    during the pause, the catch-up window decides).

    ``owner``: the caller's subject (None for admins), as for :func:`update_schedule`.

    Raises:
        ScheduleNotFound: not this tenant's schedule, or not visible to ``owner`` (404).
        InvalidState: the schedule is completed (a fired one-off) (409).
    """

    async def pause_tx(conn: AsyncConnection) -> RowMapping:
        row = await sched_q.get_schedule(conn, tenant_id, schedule_id, lock=True, owner=owner)
        state = ScheduleState(row["state"])
        if state == ScheduleState.COMPLETED:
            raise InvalidState(
                "schedule is completed (its one-off time has fired); PATCH a new time first",
                schedule_id=str(schedule_id),
            )
        want = ScheduleState.PAUSED if paused else ScheduleState.ACTIVE
        if state == want:
            return row
        values: dict[str, Any] = {"state": want.value}
        if not paused:
            current = now or await fetch_now(conn, db.dialect)
            values.update(_timing_values(schedule_id, dict(row), current))
        return await sched_q.update_schedule(conn, tenant_id, schedule_id, values)

    return await db.write_retrying(pause_tx, what="pause schedule")


# --- firing ------------------------------------------------------------------------------


@dataclass(slots=True)
class PassResult:
    """What one pass over one schedule did (for tests, logs and metrics)."""

    started: int = 0
    skipped: int = 0
    buffered: int = 0
    failed: int = 0
    missed: int = 0
    already_fired: int = 0


@dataclass(frozen=True, slots=True)
class Fire:
    """The record of one fired tick, as ``trigger_now`` returns it."""

    tick: datetime
    outcome: FireOutcome
    run_id: uuid.UUID | None
    error: str | None = None


async def _start_run(
    conn: AsyncConnection, submitter: Submitter, row: RowMapping, tick: datetime, kind: FireKind
) -> uuid.UUID:
    key = f"schedule:{row['schedule_id']}:{tick.astimezone(UTC).isoformat()}"
    if kind == FireKind.MANUAL:
        key = f"schedule:{row['schedule_id']}:manual:{tick.astimezone(UTC).isoformat()}"
    request = SubmitRequest(
        workflow=row["workflow"],
        input=json.loads(row["input"]),
        version=row["version"],
        idempotency_key=key,
    )
    input_text, version = await submitter.prepare(request)
    # The run acts for the schedule's creator: the same subject, API key (re-checked by
    # each of its attempts) and, at least, the schedule's access policy.
    access = AccessPolicy.stricter(row["access"], await submitter.access(row["workflow"], version))
    run, _ = await insert_prepared(
        conn,
        request,
        input_text,
        version,
        tenant_id=row["tenant_id"],
        subject=row["created_by"],
        api_key_id=row["api_key_id"],
        access=access.value,
    )
    run_id: uuid.UUID = run["run_id"]
    return run_id


async def _refuse(
    conn: AsyncConnection, row: RowMapping, tick: datetime
) -> authority.Refusal | None:
    """Re-check the schedule's principal; a refused tick is recorded ``failed`` with why.

    Nothing is done in the name of a suspended tenant or a revoked API key (nor are
    earlier runs cancelled): the tick is used up, its fire row says why (``error``), and
    ``treadle_schedule_fires_refused_total{cause}`` counts it.
    """
    refused = await authority.refusal(conn, row)
    if refused is None:
        return None
    await sched_q.set_fire(
        conn,
        tenant_id=row["tenant_id"],
        schedule_id=row["schedule_id"],
        tick=tick,
        outcome=FireOutcome.FAILED.value,
        error=refused.detail,
    )
    metrics.SCHEDULE_FIRES_REFUSED.labels(refused.cause).inc()
    return refused


async def fire_tick(
    conn: AsyncConnection,
    submitter: Submitter,
    row: RowMapping,
    tick: datetime,
    *,
    kind: FireKind,
    now: datetime,
    fired_by: str,
    buffer_free: bool,
) -> Fire | None:
    """Fire one tick of a (locked) schedule under its overlap policy.

    Args:
        conn: the caller's write transaction (the fire and its run commit together).
        submitter: validates and inserts the run.
        row: the schedule row.
        tick: the nominal tick (UTC).
        kind: cron, once or manual.
        now: the scheduler's clock, stored as ``fired_at``.
        fired_by: scheduler id or the subject who triggered it.
        buffer_free: buffer_one may still hold this tick back (no tick is buffered).

    Returns:
        The fire record, or None when this tick had already fired (the
        ``schedule_fires`` primary key refused the second insert): nothing was done.
    """
    schedule_id: uuid.UUID = row["schedule_id"]
    policy = Overlap(row["overlap"])
    open_runs = await sched_q.open_run_ids(conn, row["tenant_id"], schedule_id)
    outcome = FireOutcome.STARTED
    if open_runs and policy == Overlap.SKIP:
        outcome = FireOutcome.SKIPPED
    elif open_runs and policy == Overlap.BUFFER_ONE:
        outcome = FireOutcome.BUFFERED if buffer_free else FireOutcome.SKIPPED
    inserted = await sched_q.insert_fire(
        conn,
        schedule_id=schedule_id,
        tenant_id=row["tenant_id"],
        tick=tick,
        kind=kind.value,
        outcome=outcome.value,
        fired_at=now,
        fired_by=fired_by,
    )
    if not inserted:
        return None
    fire = await _fire_inserted(conn, submitter, row, tick, kind, fired_by, outcome, open_runs)
    # Counted by what the tick finally did (a refused or failed start is "failed").
    metrics.SCHEDULE_FIRES.labels(row["workflow"], fire.outcome.value).inc()
    return fire


async def _fire_inserted(
    conn: AsyncConnection,
    submitter: Submitter,
    row: RowMapping,
    tick: datetime,
    kind: FireKind,
    fired_by: str,
    outcome: FireOutcome,
    open_runs: list[uuid.UUID],
) -> Fire:
    tenant_id: str = row["tenant_id"]
    schedule_id: uuid.UUID = row["schedule_id"]
    policy = Overlap(row["overlap"])
    if outcome != FireOutcome.STARTED:
        return Fire(tick, outcome, None)
    # Before cancel_previous: a principal that may not act cancels nothing either.
    refused = await _refuse(conn, row, tick)
    if refused is not None:
        return Fire(tick, FireOutcome.FAILED, None, refused.detail)
    if policy == Overlap.CANCEL_PREVIOUS:
        for run_id in open_runs:
            await control._cancel_in(
                conn,
                tenant_id=row["tenant_id"],
                run_id=run_id,
                actor=fired_by,
                reason=f"schedule {row['name']!r} fired tick {tick.isoformat()} (cancel_previous)",
            )
    try:
        run_id = await _start_run(conn, submitter, row, tick, kind)
    except TreadleError as exc:
        # The definition vanished or the input no longer validates: the tick is used up
        # (recorded as failed, with why) rather than retried forever.
        await sched_q.set_fire(
            conn,
            tenant_id=tenant_id,
            schedule_id=schedule_id,
            tick=tick,
            outcome="failed",
            error=exc.detail[:1000],
        )
        return Fire(tick, FireOutcome.FAILED, None, exc.detail[:1000])
    await sched_q.set_fire(
        conn,
        tenant_id=tenant_id,
        schedule_id=schedule_id,
        tick=tick,
        outcome="started",
        run_id=run_id,
    )
    return Fire(tick, FireOutcome.STARTED, run_id)


async def advance(
    conn: AsyncConnection,
    submitter: Submitter,
    row: RowMapping,
    *,
    now: datetime,
    fired_by: str,
    max_fires: int = 100,
    max_missed: int = 10_000,
) -> PassResult:
    """One pass over one locked, active schedule: buffered tick, then due ticks.

    Walks ticks whose fire time is at or before ``now``; each is either skipped as
    missed (later than the catch-up window) or fired (:func:`fire_tick`). At most
    ``max_fires`` fires and ``max_missed`` skips per pass, so a long outage is worked
    off in bounded transactions. Then stores the next tick.
    """
    result = PassResult()
    tenant_id: str = row["tenant_id"]
    schedule_id: uuid.UUID = row["schedule_id"]
    values: dict[str, Any] = {}
    last_error: str | None = row["last_error"]
    buffered: datetime | None = row["buffered_tick_at"]
    if buffered is not None and not await sched_q.open_run_ids(conn, tenant_id, schedule_id):
        # The run that held the buffered tick back has finished: start it now, once
        # (only the pass that flips the fire row from "buffered" does).
        if not await sched_q.set_fire(
            conn,
            tenant_id=tenant_id,
            schedule_id=schedule_id,
            tick=buffered,
            outcome="started",
            only_if_outcome="buffered",
        ):
            pass  # another pass started it
        elif (refused := await _refuse(conn, row, buffered)) is not None:
            last_error = refused.detail
            result.failed += 1
        else:
            try:
                run_id = await _start_run(conn, submitter, row, buffered, FireKind.CRON)
                await sched_q.set_fire(
                    conn,
                    tenant_id=tenant_id,
                    schedule_id=schedule_id,
                    tick=buffered,
                    outcome="started",
                    run_id=run_id,
                )
                result.started += 1
            except TreadleError as exc:
                last_error = exc.detail[:1000]
                await sched_q.set_fire(
                    conn,
                    tenant_id=tenant_id,
                    schedule_id=schedule_id,
                    tick=buffered,
                    outcome="failed",
                    error=last_error,
                )
                result.failed += 1
        buffered = None
        values["buffered_tick_at"] = None
    tick: datetime | None = row["next_tick_at"]
    kind = FireKind.CRON if row["cron"] is not None else FireKind.ONCE
    window = timedelta(seconds=int(row["catchup_window_seconds"]))
    last_tick = row["last_tick_at"]
    while tick is not None and fire_time(row, tick) <= now:
        if result.started + result.skipped + result.buffered + result.failed >= max_fires:
            break
        if result.missed >= max_missed:
            break
        if now - fire_time(row, tick) > window:
            result.missed += 1
        else:
            fire = await fire_tick(
                conn,
                submitter,
                row,
                tick,
                kind=kind,
                now=now,
                fired_by=fired_by,
                buffer_free=buffered is None,
            )
            if fire is None:
                result.already_fired += 1
            elif fire.outcome == FireOutcome.STARTED:
                result.started += 1
            elif fire.outcome == FireOutcome.BUFFERED:
                result.buffered += 1
                buffered = tick
                values["buffered_tick_at"] = tick
            elif fire.outcome == FireOutcome.SKIPPED:
                result.skipped += 1
            else:
                result.failed += 1
                last_error = fire.error
        last_tick = tick
        tick = _next(row, tick)
    if result.missed:
        metrics.SCHEDULE_TICKS_MISSED.labels(row["workflow"]).inc(result.missed)
    if not values and tick == row["next_tick_at"]:
        return result  # a buffered tick still waiting on its open run: nothing to write
    values.update(
        {
            "next_tick_at": tick,
            "next_fire_at": None if tick is None else fire_time(row, tick),
            "last_tick_at": last_tick,
            "last_error": last_error,
            "fired_count": row["fired_count"] + result.started,
            "missed_count": row["missed_count"] + result.missed,
            "skipped_count": row["skipped_count"] + result.skipped,
        }
    )
    if tick is None and buffered is None:
        values["state"] = ScheduleState.COMPLETED.value
    await sched_q.update_schedule(conn, tenant_id, schedule_id, values)
    return result


async def trigger_now(
    db: Database,
    submitter: Submitter,
    *,
    tenant_id: str,
    schedule_id: uuid.UUID,
    actor: str,
    owner: str | None = None,
    now: datetime | None = None,
) -> Fire:
    """Fire a schedule once now ("trigger now"), under its overlap policy.

    The tick is the current time (kind ``manual``); the regular ticks are unaffected.
    Works on paused schedules too.

    The run is started in the name of the schedule's creator (never the caller's), so
    ``owner`` (the caller's subject, None for admins) must see the schedule: another
    subject's owner-policy schedule is not found. The creator's principal is re-checked
    as at every fire: a revoked key or suspended tenant records the fire ``failed``.

    Raises:
        ScheduleNotFound: not this tenant's schedule, or not visible to ``owner`` (404).
        InvalidState: the tick already fired (two triggers in the same microsecond) (409).
    """

    async def trigger_tx(conn: AsyncConnection) -> Fire:
        row = await sched_q.get_schedule(conn, tenant_id, schedule_id, lock=True, owner=owner)
        tick = now or await fetch_now(conn, db.dialect)
        fire = await fire_tick(
            conn,
            submitter,
            row,
            tick,
            kind=FireKind.MANUAL,
            now=tick,
            fired_by=actor,
            buffer_free=row["buffered_tick_at"] is None,
        )
        if fire is None:
            raise InvalidState("this tick already fired; retry", schedule_id=str(schedule_id))
        values: dict[str, Any] = {}
        if fire.outcome == FireOutcome.STARTED:
            values["fired_count"] = row["fired_count"] + 1
        elif fire.outcome == FireOutcome.SKIPPED:
            values["skipped_count"] = row["skipped_count"] + 1
        elif fire.outcome == FireOutcome.BUFFERED:
            values["buffered_tick_at"] = tick
        else:
            values["last_error"] = fire.error
        if values:
            await sched_q.update_schedule(conn, tenant_id, schedule_id, values)
        return fire

    return await db.write_retrying(trigger_tx, what="trigger schedule")


class Scheduler:
    """A scheduler loop: finds due schedules and fires their ticks.

    Runs in every worker process and in ``treadle dev``; any number of loops may run at
    once against one database (each pass locks one schedule with ``SKIP LOCKED`` on
    PostgreSQL, and the ``schedule_fires`` key makes every tick exactly-once regardless).

    Args:
        db: the database.
        settings: loop interval.
        submitter: validates and inserts runs (shared with the worker).
        clock: "now"; default the database clock.
        scheduler_id: recorded as ``fired_by``.
        on_fire: called after a pass started runs (the in-process worker's wake-up).
    """

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        submitter: Submitter | None = None,
        clock: Clock | None = None,
        scheduler_id: str | None = None,
        on_fire: Callable[[], None] | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.submitter = submitter or Submitter(db, settings)
        self.clock: Clock = clock or db.now
        self.scheduler_id = scheduler_id or f"scheduler:{uuid.uuid4().hex[:8]}"
        self.on_fire = on_fire
        self.totals = PassResult()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Look for due ticks now rather than at the next interval."""
        self._wake.set()

    async def run_once(self, limit: int = 100) -> PassResult:
        """One sweep over the due schedules; returns what it did in total."""
        now = await self.clock()
        async with self.db.read() as conn:
            keys = await sched_q.due_schedules(conn, now=now, limit=limit)
        total = PassResult()
        for tenant_id, schedule_id in keys:
            async with self.db.write() as conn:
                # By the whole key: the pass reads and writes one tenant's rows only.
                row = await sched_q.lock_for_pass(conn, tenant_id, schedule_id)
                if row is None:
                    continue  # another loop is on it, or it was paused or deleted
                result = await advance(
                    conn, self.submitter, row, now=now, fired_by=self.scheduler_id
                )
            for name in ("started", "skipped", "buffered", "failed", "missed", "already_fired"):
                value = getattr(result, name)
                setattr(total, name, getattr(total, name) + value)
                setattr(self.totals, name, getattr(self.totals, name) + value)
        if total.started and self.on_fire is not None:
            self.on_fire()
        return total

    async def run(self) -> None:
        """Loop until cancelled; database errors are logged and retried next interval."""
        interval = self.settings.scheduler_interval_seconds
        while True:
            self._wake.clear()
            try:
                done = await self.run_once()
                if done.started + done.skipped + done.buffered + done.failed + done.missed:
                    continue  # a capped pass (long outage) may have left work behind
            except Exception as exc:  # noqa: BLE001 - DB down: keep going, never die
                log.warning("scheduler pass failed", error=str(exc)[:300])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)
