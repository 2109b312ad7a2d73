"""Database rows to API models."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic_core import to_jsonable_python
from sqlalchemy import RowMapping

from app.api import schemas
from app.api.log_schemas import LogLine
from app.core import json
from app.core.status import EventKind, RunReason
from app.core.text import human_duration, printable
from app.db.queries import run_labels as labels_q
from app.db.queries.steps import step_reason

# Events whose data never holds a payload: kept on a redacted run so the timeline still
# tells what happened.
_SAFE_EVENTS = frozenset(
    {
        EventKind.RUN_SUBMITTED.value,
        EventKind.RUN_CLAIMED.value,
        EventKind.RUN_FAILED.value,
        EventKind.DEAD_LETTER_WRITTEN.value,
    }
)


def is_redacted(run: RowMapping) -> bool:
    """True when the run's payloads must be withheld from every read.

    A run that failed its authorization re-check (suspended tenant, revoked API key) keeps
    its data in the database for the operators' retention tiers, but no API view shows its
    input, output, step results, errors of user code or event data again.
    """
    return bool(run["reason"] == RunReason.FAILURE_AUTHORIZATION.value)


def withheld_outputs(run: RowMapping) -> frozenset[str]:
    """Step ids whose ``output`` no view of this run shows.

    A state machine that failed ``failure_corrupt_state`` could not decode the state its
    transition step journaled (the run error's ``step_id``): that output is withheld from
    steps and reports as ``state`` is from the snapshot (docs/api.md), since its fields
    are exactly what no longer validates and may hold what a renamed field used to mean.
    """
    if run["reason"] != RunReason.FAILURE_CORRUPT_STATE.value:
        return frozenset()
    try:
        error = json.loads(run["error"])
    except ValueError:
        return frozenset()
    step_id = error.get("step_id") if isinstance(error, dict) else None
    return frozenset({step_id}) if isinstance(step_id, str) else frozenset()


def _run_values(
    row: RowMapping,
    step_counts: dict[str, int] | None,
    blocked: str | None,
    state: dict[str, Any] | None,
) -> dict[str, Any]:
    # The members of a run's view as Python values, in schemas.Run's field order: what
    # run_view validates into the model and run_json turns into JSON, so the two views of
    # a run cannot drift apart (tests/integration/test_run_json.py).
    redacted = is_redacted(row)
    waiting = None
    if row["waiting_kind"]:
        waiting = {
            "kind": row["waiting_kind"],
            "name": row["waiting_name"],
            "deadline": row["waiting_deadline"],
        }
    return {
        "run_id": row["run_id"],
        "workflow": row["workflow"],
        "version": row["version"],
        "status": row["status"],
        "reason": row["reason"],
        "input": None if redacted else json.loads(row["input"]),
        "output": None if redacted else json.loads(row["output"]),
        "error": json.loads(row["error"]),
        "idempotency_key": row["idempotency_key"],
        "concurrency_key": row["concurrency_key"],
        "concurrency_slot": row["concurrency_slot"],
        "priority": row["priority"],
        "attempt": row["attempt"],
        "lease_owner": row["lease_owner"],
        "lease_expires_at": row["lease_expires_at"],
        "waiting_on": waiting,
        "labels": labels_q.decode(row.get("labels")),
        "blocked_reason": blocked or row["blocked_reason"],
        "step_counts": step_counts,
        "state": state,
        "created_by": row["created_by"],
        "parent_run_id": row.get("parent_run_id"),
        "access": row["access"],
        "redacted": redacted,
        "paused_at": row.get("paused_at"),
        "paused_by": row.get("paused_by"),
        "pause_reason": row.get("pause_reason"),
        "rerun_of": row.get("rerun_of"),
        "rerun_from_step": row.get("rerun_from_step"),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "compacted_at": row["compacted_at"],
    }


def run_view(
    row: RowMapping,
    step_counts: dict[str, int] | None = None,
    blocked: str | None = None,
    state: dict[str, Any] | None = None,
) -> schemas.Run:
    """Build a :class:`schemas.Run` from a ``runs`` row (payloads withheld if redacted).

    ``state`` is a state machine's current state.
    """
    return schemas.Run.model_validate(_run_values(row, step_counts, blocked, state))


def run_json(
    row: RowMapping,
    step_counts: dict[str, int] | None = None,
    blocked: str | None = None,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON object of :func:`run_view`, without building the pydantic model.

    Equal, member for member and in the same order, to
    ``run_view(row, ...).model_dump(mode="json", by_alias=True)``: UUIDs as strings,
    datetimes in pydantic's ISO 8601 form (``Z`` for UTC), payloads as decoded. For
    responses holding many runs (``POST /runs:batch``: one model per run was a third of
    a 1,000-run request's time, docs/benchmarks.md); encode it with the app's
    :class:`app.api.responses.AsciiJSONResponse`.
    """
    # pydantic's own conversion (UUIDs, datetimes with "Z", nested members), without
    # validating a model: the same JSON values model_dump(mode="json") gives.
    values: dict[str, Any] = to_jsonable_python(
        _run_values(row, step_counts, blocked, None), by_alias=True
    )
    if state is not None:
        # Detail views only (never a batch): the model's own dump of the state.
        values["state"] = schemas.RunState.model_validate(state).model_dump(mode="json")
    return values


def step_view(
    row: RowMapping, redacted: bool = False, withheld: frozenset[str] = frozenset()
) -> schemas.Step:
    """Build a :class:`schemas.Step` from a ``steps`` row.

    ``redacted`` withholds every payload (see :func:`is_redacted`); ``withheld`` names
    steps whose output alone is withheld (see :func:`withheld_outputs`).
    """
    started, finished = row["started_at"], row["finished_at"]
    if started is not None and finished is not None and finished < started:
        # A finish older than the attempt's start is an earlier attempt's: rows whose
        # attempt began before an attempt's start cleared ``finished_at`` hold one.
        finished = None
    duration = None
    if started is not None and finished is not None:
        duration = (finished - started).total_seconds() * 1000.0
    return schemas.Step(
        step_id=row["step_id"],
        seq=row["seq"],
        kind=row["kind"],
        name=row["name"],
        status=row["status"],
        reason=step_reason(row["status"], row["error"]),
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        output=None if redacted or row["step_id"] in withheld else json.loads(row["output"]),
        error=None if redacted else json.loads(row["error"]),
        next_attempt_at=row["next_attempt_at"],
        deadline=row["deadline"],
        detail=None if redacted else json.loads(row["detail"]),
        created_at=row["created_at"],
        started_at=started,
        finished_at=finished,
        duration_ms=duration,
    )


def event_view(row: RowMapping, redacted: bool = False) -> schemas.Event:
    """Build a :class:`schemas.Event` from an ``events`` row (see :func:`is_redacted`)."""
    hide = redacted and row["kind"] not in _SAFE_EVENTS
    return schemas.Event(
        event_id=row["event_id"],
        at=row["at"],
        kind=row["kind"],
        step_id=row["step_id"],
        actor=row["actor"],
        data=None if hide else json.loads(row["data"]),
    )


def dead_letter_view(row: RowMapping) -> schemas.DeadLetter:
    """Build a :class:`schemas.DeadLetter` from a ``dead_letters`` row."""
    return schemas.DeadLetter(
        dead_letter_id=row["dead_letter_id"],
        run_id=row["run_id"],
        workflow=row["workflow"],
        reason=row["reason"],
        error=json.loads(row["error"]),
        status=row["status"],
        created_at=row["created_at"],
        requeued_at=row["requeued_at"],
        requeued_by=row["requeued_by"],
        requeue_reason=row["requeue_reason"],
        correlation_id=row["correlation_id"],
    )


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _run_duration(run: schemas.Run, now: datetime) -> str:
    # From submission, so time queued and waiting counts: what the run took for its client.
    if run.finished_at is not None:
        took = (run.finished_at - run.created_at).total_seconds()
        return f"duration     {human_duration(max(took, 0.0))} (created to finished)"
    so_far = (now - run.created_at).total_seconds()
    return f"duration     {human_duration(max(so_far, 0.0))} so far (created to this report)"


def log_view(row: RowMapping, redacted: bool = False) -> LogLine:
    """Build a :class:`LogLine` from a ``run_logs`` row.

    ``redacted`` (see :func:`is_redacted`) withholds the message and fields, which handler
    code fills from the run's payloads; the time, level, step and attempt stay, so the run's
    story keeps its shape.
    """
    return LogLine(
        seq=row["seq"],
        at=row["at"],
        level=row["level"],
        message=None if redacted else json.loads(row["message"]),
        fields=None if redacted or row["fields"] is None else json.loads(row["fields"]),
        step_id=row["step_id"],
        attempt=row["attempt"],
    )


def _log_text(line: LogLine) -> str:
    where = f" [{line.step_id}#{line.attempt}]" if line.step_id is not None else ""
    if line.message is None:
        return f"{line.at.isoformat()}  {line.level:<8}{where} (message withheld: run redacted)"
    fields = f" {_short(line.fields)}" if line.fields else ""
    return f"{line.at.isoformat()}  {line.level:<8}{where} {_short(line.message, 500)}{fields}"


def render_report_text(report: schemas.RunReport) -> str:
    r"""Render the operator's report as five plain-text sections for a terminal.

    Sections: RUN, STEPS, TIMELINE, LOGS (the last ``ctx.logger`` lines), DEAD LETTERS.
    Times are UTC ISO 8601, durations in human units (:func:`app.core.text.human_duration`);
    the run's ``claims`` (how many times a worker took it) are named apart from a step's
    ``attempt n/max``. Every line goes through :func:`app.core.text.printable`: whatever a
    message, step name or payload holds (a lone surrogate, NUL, a line break, ESC, an RTL
    override) shows as a ``\uXXXX`` escape inside its line, so the text always encodes as
    UTF-8 and no value can forge a line or a section.
    """
    r = report.run
    lines = [
        f"Treadle run report — generated {report.generated_at.isoformat()}",
        "",
        "== RUN ==",
        f"run_id       {r.run_id}",
        f"workflow     {r.workflow} (version {r.version})",
        f"status       {r.status}" + (f" ({r.reason})" if r.reason else ""),
        # The run's claims, not a step's attempts (those are "attempt n/max" per step).
        f"claims       {r.attempt} (executions: times a worker took the run)",
        f"created      {r.created_at.isoformat()} by {r.created_by}",
        f"started      {r.started_at.isoformat() if r.started_at else '-'}",
        f"finished     {r.finished_at.isoformat() if r.finished_at else '-'}",
        _run_duration(r, report.generated_at),
        f"lease        {r.lease_owner or '-'}"
        + (f" until {r.lease_expires_at.isoformat()}" if r.lease_expires_at else ""),
    ]
    if r.waiting_on is not None:
        deadline = r.waiting_on.deadline.isoformat() if r.waiting_on.deadline else "none"
        lines.append(
            f"waiting on   {r.waiting_on.kind} {r.waiting_on.name or ''} (deadline {deadline})"
        )
    if r.labels:
        # Label text is printable by rule (app/core/labels.py): safe on one line.
        lines.append("labels       " + ", ".join(f"{k}={v}" for k, v in sorted(r.labels.items())))
    if r.blocked_reason:
        lines.append(f"blocked      {r.blocked_reason}")
    if r.paused_at is not None:
        why = f": {r.pause_reason}" if r.pause_reason else ""
        lines.append(f"paused       {r.paused_at.isoformat()} by {r.paused_by}{why}")
    if r.rerun_of is not None:
        lines.append(f"rerun of     {r.rerun_of} from step {r.rerun_from_step}")
    if r.compacted_at is not None:
        lines.append(f"compacted    {r.compacted_at.isoformat()} (payloads cleared by maintenance)")
    if r.state is not None:
        lines.append(f"state        {r.state.name} {_short(r.state.fields, 300)}")
    if r.output is not None:
        lines.append(f"output       {_short(r.output, 300)}")
    if r.error is not None:
        err = r.error if isinstance(r.error, dict) else {"message": r.error}
        lines.append(
            f"error        {err.get('type', 'Error')}: {_short(err.get('message', ''), 300)}"
        )
    lines += ["", f"== STEPS ({len(report.steps)}) =="]
    if not report.steps:
        lines.append("(none)")
    for s in report.steps:
        duration = human_duration(s.duration_ms / 1000) if s.duration_ms is not None else "-"
        position = "undo" if s.kind == "compensation" else str(s.seq)
        # How it ended, unless plainly: a cancel's or a rejection's reason is news.
        ended = f"  ({s.reason})" if s.reason and s.reason != s.status else ""
        lines.append(
            f"{position:>4}  {s.step_id:<32} {s.status:<12} attempt {s.attempt}/"
            f"{s.max_attempts}  {duration}{ended}"
        )
        if s.error is not None and isinstance(s.error, dict):
            lines.append(
                f"      error: {s.error.get('type', 'Error')}: {_short(s.error.get('message', ''))}"
            )
            if s.error.get("not_retried"):
                # The RetryPolicy rule that stopped the retries (app/sdk/retry.py).
                lines.append(f"      not retried: {_short(s.error['not_retried'])}")
        if s.kind != "step" and s.status == "waiting":
            deadline = s.deadline.isoformat() if s.deadline else "none"
            lines.append(f"      waiting on {s.kind} (deadline {deadline})")
        if s.next_attempt_at is not None and s.status == "retry_wait":
            lines.append(f"      next attempt at {s.next_attempt_at.isoformat()}")
    lines += [
        "",
        f"== TIMELINE ({len(report.events)} events"
        + (", truncated" if report.events_truncated else "")
        + ") ==",
    ]
    for e in report.events:
        who = f" by {e.actor}" if e.actor else ""
        step = f" [{e.step_id}]" if e.step_id else ""
        data = f" {_short(e.data)}" if e.data else ""
        lines.append(f"{e.at.isoformat()}  {e.kind}{step}{who}{data}")
    shown = f"last {len(report.logs)} of " if len(report.logs) < report.logs_total else ""
    lines += ["", f"== LOGS ({shown}{report.logs_total} lines) =="]
    if not report.logs:
        lines.append("(none)")
    lines += [_log_text(line) for line in report.logs]
    lines += ["", f"== DEAD LETTERS ({len(report.dead_letters)}) =="]
    if not report.dead_letters:
        lines.append("(none)")
    for d in report.dead_letters:
        lines.append(f"{d.dead_letter_id}  {d.status}  {d.reason}  {d.created_at.isoformat()}")
        if d.requeued_at is not None:
            lines.append(
                f"      requeued {d.requeued_at.isoformat()} by {d.requeued_by}: "
                f"{d.requeue_reason} (correlation {d.correlation_id})"
            )
    return "\n".join(printable(line) for line in lines) + "\n"
