"""Rerun from a step: a new run whose journal is the original's up to that step.

Rules (docs/adr/0022-rerun-from-a-step.md): the original must be terminal, its
workflow version still registered, and every journal entry before ``from_step`` a
result that replays on its own (succeeded, not a compensation, not undone). The rerun
is the same workflow version and input, ``rerun_of`` the original; its first claim
replays the copied prefix without executing it and executes from ``from_step`` on.
"""

from __future__ import annotations

import uuid

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.errors import IdempotencyConflict, InvalidInput, InvalidState
from app.core.settings import Settings
from app.core.status import EventKind, RunStatus, StepStatus
from app.db.database import Database
from app.db.queries import definitions as defs_q
from app.db.queries import events as events_q
from app.db.queries import runs as runs_q
from app.db.queries import steps as steps_q
from app.engine.submit import SubmitRequest, Submitter, insert_prepared

# Journal entries that are not steps a caller can name: ctx.patched markers.
_NOT_A_STEP = frozenset({"patch"})


def check_prefix(journal: list[RowMapping], from_step: str) -> int:
    """The ``seq`` of ``from_step`` once its prefix is known to replay; else raise.

    Args:
        journal: the original's entries in ``seq`` order.
        from_step: the step id the rerun executes from.

    Raises:
        InvalidInput: ``from_step`` is not a journaled step of the original (422).
        InvalidState: the prefix cannot be replayed (409): an entry before it (or the
            step itself) is a compensation, was undone, or did not succeed.
    """
    target = next(
        (e for e in journal if e["step_id"] == from_step and e["kind"] not in _NOT_A_STEP), None
    )
    if target is None:
        raise InvalidInput(
            f"{from_step!r} is not a journaled step of this run",
            errors=[{"path": "from_step", "message": "not a journaled step id of the run"}],
        )
    if target["kind"] == "compensation":
        raise InvalidState(
            f"step {from_step!r} is a compensation: a rerun starts from a step of the body"
        )
    seq = int(target["seq"])
    for entry in journal:
        if int(entry["seq"]) >= seq:
            break
        if entry["kind"] == "compensation" or entry["status"] != StepStatus.SUCCEEDED.value:
            raise InvalidState(
                f"cannot rerun from {from_step!r}: the earlier entry {entry['step_id']!r} "
                f"(kind {entry['kind']!r}) is {entry['status']!r}, not a result that "
                "replays; rerun from it or an earlier step",
                blocking_step=entry["step_id"],
            )
    return seq


async def rerun(
    db: Database,
    settings: Settings,
    *,
    tenant_id: str,
    run_id: uuid.UUID,
    from_step: str,
    subject: str,
    api_key_id: uuid.UUID | None,
    idempotency_key: str | None = None,
    owner: str | None = None,
) -> tuple[RowMapping, bool]:
    """Start a rerun of ``run_id`` from ``from_step`` (``POST /runs/{id}/rerun``).

    One transaction: the original is locked, checked, the new run inserted (admitted to
    its concurrency key like a submit), linked (``rerun_of``, ``rerun_from_step``), its
    journal prefix copied, and a ``run_rerun`` event written on the original. The input
    is validated again against the registered schema.

    Returns:
        ``(new run row, created)``: created is False when ``idempotency_key`` names an
        earlier rerun of the same run from the same step (that run is returned).

    Raises:
        RunNotFound: not this tenant's run (or not visible to ``owner``).
        InvalidInput: ``from_step`` is not a journaled step of the original (422).
        InvalidState: the original is not terminal, its workflow version is no longer
            registered, or the prefix cannot be replayed (409).
        IdempotencyConflict: the key was used for another request (409).
    """
    submitter = Submitter(db, settings)

    async def rerun_tx(conn: AsyncConnection) -> tuple[RowMapping, bool]:
        original = await runs_q.lock_run(conn, tenant_id, run_id, owner=owner)
        if idempotency_key is not None:
            twin = await runs_q.get_by_idempotency_key(conn, tenant_id, idempotency_key)
            if twin is not None:
                return _same_rerun(twin, run_id, from_step, idempotency_key), False
        if not RunStatus(original["status"]).is_terminal:
            raise InvalidState(
                f"run {run_id} is {original['status']!r}: rerun a run once it has finished "
                "(cancel it first to rerun it now)",
                run_status=original["status"],
            )
        registered = {
            d["version"] for d in await defs_q.get_definitions(conn, original["workflow"])
        }
        if original["version"] not in registered:
            raise InvalidState(
                f"workflow {original['workflow']!r} version {original['version']!r} is no "
                "longer registered: a rerun replays the original's version",
                workflow=original["workflow"],
                version=original["version"],
            )
        journal = list(await steps_q.load_journal(conn, run_id, tenant_id=tenant_id))
        seq = check_prefix(journal, from_step)
        request = SubmitRequest(
            workflow=original["workflow"],
            input=json.loads(original["input"]),
            version=original["version"],
            idempotency_key=idempotency_key,
            concurrency_key=original["concurrency_key"],
            priority=int(original["priority"]),
        )
        input_text, version = await submitter.prepare(request)
        row, created = await insert_prepared(
            conn,
            request,
            input_text,
            version,
            tenant_id=tenant_id,
            subject=subject,
            api_key_id=api_key_id,
            access=original["access"],
            queue=await submitter.queue(request.workflow, version),
        )
        if not created:  # a concurrent rerun with the same key won the insert
            return _same_rerun(row, run_id, from_step, idempotency_key), False
        new_id = row["run_id"]
        row = await runs_q.set_rerun_of(conn, run_id=new_id, rerun_of=run_id, from_step=from_step)
        copied = await steps_q.copy_journal_prefix(
            conn, source_run_id=run_id, target_run_id=new_id, tenant_id=tenant_id, before_seq=seq
        )
        await events_q.append(
            conn,
            run_id=run_id,
            tenant_id=tenant_id,
            kind=EventKind.RUN_RERUN,
            actor=subject,
            data={"rerun_run_id": str(new_id), "from_step": from_step, "replayed": copied},
        )
        return row, True

    return await db.write_retrying(rerun_tx, what="rerun")


def _same_rerun(
    twin: RowMapping, run_id: uuid.UUID, from_step: str, idempotency_key: str | None
) -> RowMapping:
    # An idempotent retry: the key's run must be a rerun of this run from this step.
    if twin["rerun_of"] != run_id or twin["rerun_from_step"] != from_step:
        raise IdempotencyConflict(
            f"idempotency key {idempotency_key!r} was already used for a different request",
        )
    return twin
