"""Actions on a run from outside: signals, decisions, resume, retry, pause and rerun."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Request, Response

from app.api import schemas
from app.api.deps import (
    DB,
    DecidesApprovals,
    Pauses,
    Reruns,
    Resumes,
    Retries,
    SettingsDep,
    Signals,
    Unpauses,
    wake_workers,
)
from app.api.problems import PROBLEM_RESPONSES
from app.api.routes.runs import parse_run_id
from app.api.views import dead_letter_view, run_view
from app.core import metrics
from app.core.limits import MAX_SIGNAL_NAME
from app.engine import control
from app.engine import rerun as rerun_engine

router = APIRouter(prefix="/runs", tags=["runs"])

_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": schemas.Problem, "description": "Run finished or wrong state"}
}
SignalName = Annotated[
    str, Path(min_length=1, max_length=MAX_SIGNAL_NAME, pattern=r"^[A-Za-z0-9_.\-]+$")
]
StepPath = Annotated[str, Path(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.\-#:]+$")]


@router.post(
    "/{run_id}/signals/{name}",
    operation_id="send_signal",
    status_code=202,
    response_model=schemas.SignalAccepted,
    responses={
        **PROBLEM_RESPONSES,
        **_CONFLICT,
        413: {"model": schemas.Problem, "description": "Payload over the limit"},
    },
)
async def send_signal(
    run_id: str,
    request: Request,
    name: SignalName,
    principal: Signals,
    db: DB,
    settings: SettingsDep,
    body: Annotated[schemas.SendSignalRequest | None, Body()] = None,
) -> schemas.SignalAccepted:
    """Send the signal ``name`` to a run (scope ``signals:write``).

    Signals that arrive before the run waits for them are buffered and consumed in order
    by its next ``ctx.signal(name)``, each exactly once. 409 once the run has finished.
    """
    rid = parse_run_id(run_id)
    signal_id = await control.send_signal(
        db,
        settings,
        tenant_id=principal.tenant_id,
        run_id=rid,
        name=name,
        payload=body.payload if body else None,
        actor=principal.subject,
        owner=principal.owner_filter,
    )
    wake_workers(request)
    return schemas.SignalAccepted(run_id=rid, name=name, signal_id=signal_id)


@router.post(
    "/{run_id}/approvals/{step_id}",
    operation_id="decide_approval",
    response_model=schemas.ApprovalDecisionResult,
    responses={**PROBLEM_RESPONSES, **_CONFLICT},
)
async def decide_approval(
    run_id: str,
    request: Request,
    step_id: StepPath,
    body: schemas.ApprovalDecisionRequest,
    principal: DecidesApprovals,
    db: DB,
    settings: SettingsDep,
) -> schemas.ApprovalDecisionResult:
    """Approve or reject a waiting approval (scope ``approvals:write``).

    The decider is the token's subject. 403 if the approval names a group the token's
    ``groups`` claim lacks, or if the subject submitted the run and self-approval is not
    allowed; 404 for an unknown approval; 409 if it is not waiting, already decided, or
    this subject already decided it.
    """
    rid = parse_run_id(run_id)
    result = await control.decide_approval(
        db,
        settings,
        tenant_id=principal.tenant_id,
        run_id=rid,
        step_id=step_id,
        subject=principal.subject,
        groups=principal.groups,
        decision=body.decision,
        payload=body.payload,
        comment=body.comment,
        owner=principal.owner_filter,
    )
    wake_workers(request)
    return schemas.ApprovalDecisionResult(run_id=rid, **result)


@router.post(
    "/{run_id}/resume",
    operation_id="resume_run",
    response_model=schemas.Run,
    responses={**PROBLEM_RESPONSES, **_CONFLICT},
)
async def resume_run(run_id: str, principal: Resumes, db: DB) -> schemas.Run:
    """Make a waiting or retrying run due now (skip a backoff, re-check its waits).

    A wait that is still unsatisfied simply waits again. 409 if the run is not waiting.
    """
    row = await control.resume(
        db,
        tenant_id=principal.tenant_id,
        run_id=parse_run_id(run_id),
        actor=principal.subject,
        owner=principal.owner_filter,
    )
    return run_view(row)


@router.post(
    "/{run_id}/retry",
    operation_id="retry_run",
    response_model=schemas.DeadLetter,
    responses={**PROBLEM_RESPONSES, **_CONFLICT},
)
async def retry_run(
    run_id: str, body: schemas.RequeueRequest, principal: Retries, db: DB
) -> schemas.DeadLetter:
    """Re-run a failed run from its failed point (requeues its pending dead letter).

    409 if the run is not failed or was already requeued.
    """
    rid = parse_run_id(run_id)
    dl_id = await control.pending_dead_letter_id(
        db, tenant_id=principal.tenant_id, run_id=rid, owner=principal.owner_filter
    )
    row = await control.requeue_dead_letter(
        db,
        tenant_id=principal.tenant_id,
        dead_letter_id=dl_id,
        actor=principal.subject,
        reason=body.reason,
        correlation_id=body.correlation_id,
        owner=principal.owner_filter,
    )
    return dead_letter_view(row)


@router.post(
    "/{run_id}/pause",
    operation_id="pause_run",
    response_model=schemas.Run,
    responses={**PROBLEM_RESPONSES, **_CONFLICT},
)
async def pause_run(
    run_id: str,
    principal: Pauses,
    db: DB,
    body: Annotated[schemas.PauseRunRequest | None, Body()] = None,
) -> schemas.Run:
    """Pause a run (scope ``runs:write``): no new step, no claim, until unpaused.

    It finishes its current step attempt, then its worker releases it.

    Timers and retries falling due meanwhile, signals and approval decisions are kept and
    acted on after unpause; cancel still works. ``status`` keeps what the run waits on;
    ``paused_at``, ``paused_by`` and ``pause_reason`` show the pause. Pausing a paused run
    returns it unchanged. 409 if the run has finished.
    """
    rid = parse_run_id(run_id)
    row, changed = await control.pause(
        db,
        tenant_id=principal.tenant_id,
        run_id=rid,
        actor=principal.subject,
        reason=body.reason if body else None,
        owner=principal.owner_filter,
    )
    if changed:
        metrics.RUN_CONTROLS.labels("pause").inc()
    return run_view(row)


@router.post(
    "/{run_id}/unpause",
    operation_id="unpause_run",
    response_model=schemas.Run,
    responses={**PROBLEM_RESPONSES, **_CONFLICT},
)
async def unpause_run(run_id: str, request: Request, principal: Unpauses, db: DB) -> schemas.Run:
    """Unpause a paused run (scope ``runs:write``).

    It is claimable again at once if anything fell due while it was paused. 409 if it is
    not paused or has finished.
    """
    row = await control.unpause(
        db,
        tenant_id=principal.tenant_id,
        run_id=parse_run_id(run_id),
        actor=principal.subject,
        owner=principal.owner_filter,
    )
    metrics.RUN_CONTROLS.labels("unpause").inc()
    wake_workers(request)
    return run_view(row)


@router.post(
    "/{run_id}/rerun",
    operation_id="rerun_run",
    response_model=schemas.Run,
    status_code=201,
    responses={
        **PROBLEM_RESPONSES,
        **_CONFLICT,
        200: {"model": schemas.Run, "description": "Idempotent retry: the same rerun"},
    },
)
async def rerun_run(
    run_id: str,
    body: schemas.RerunRequest,
    request: Request,
    response: Response,
    principal: Reruns,
    db: DB,
    settings: SettingsDep,
) -> schemas.Run:
    """Rerun a finished run from step ``from_step`` (scope ``runs:write``).

    A new run of the same workflow version and input. Its ``rerun_of`` is this run; its
    journal is this run's up to (not including) ``from_step``, so those results replay
    and are not executed again. 201 with ``Location``; 200 with the same run for a retry
    with the same ``idempotency_key``. 422 if ``from_step`` is not a journaled step of the
    run; 409 if the run has not finished, its workflow version is no longer registered, or
    an entry before ``from_step`` cannot replay (a compensation, an undone or unfinished
    step).
    """
    row, created = await rerun_engine.rerun(
        db,
        settings,
        tenant_id=principal.tenant_id,
        run_id=parse_run_id(run_id),
        from_step=body.from_step,
        subject=principal.subject,
        api_key_id=principal.api_key_id,
        idempotency_key=body.idempotency_key,
        owner=principal.owner_filter,
    )
    if created:
        metrics.RUN_CONTROLS.labels("rerun").inc()
        wake_workers(request)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/runs/{row['run_id']}"
    return run_view(row)
