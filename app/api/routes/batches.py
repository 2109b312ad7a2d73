"""Bulk actions on runs (``POST /runs:<action>``) and their durable batches (``/batches``).

The API only creates and reads batches; workers act on the runs
(app/engine/batches.py, docs/adr/0023-durable-batches.md).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response

from app.api import batch_schemas as bs
from app.api import schemas
from app.api.deps import DB, RunsRead, RunsWrite, SettingsDep, Signals, require_action
from app.api.pagination import decode_token, encode_token
from app.api.problems import PROBLEM_RESPONSES
from app.auth.principal import Principal
from app.core import json
from app.core.errors import BadRequest, BatchNotFound, InvalidInput
from app.core.labels import MAX_LABELS, parse_label_filter
from app.core.settings import Settings
from app.db.database import Database
from app.db.queries.run_filters import RunListFilters
from app.engine import batches as engine
from app.engine.batches import BatchAction, DryRun

router = APIRouter(tags=["batches"])


def _filters(f: bs.BulkFilter) -> RunListFilters:
    """The body's filter as ``GET /runs`` would apply it (same label rules)."""
    if len(f.labels) > MAX_LABELS:
        raise InvalidInput(
            f"at most {MAX_LABELS} label filters",
            errors=[{"path": "body.filter.labels", "message": "too many label filters"}],
        )
    kind, name = None, None
    if f.waiting_on is not None:
        kind, _, rest = f.waiting_on.partition(":")
        name = rest or None
    return RunListFilters(
        workflow=f.workflow,
        status=f.status.value if f.status else None,
        reason=f.reason.value if f.reason else None,
        version=f.version,
        created_after=f.created_after,
        created_before=f.created_before,
        finished_after=f.finished_after,
        finished_before=f.finished_before,
        idempotency_key=f.idempotency_key,
        waiting_kind=kind,
        waiting_name=name,
        labels=tuple(parse_label_filter(f"label.{k}", v) for k, v in sorted(f.labels.items())),
    )


def batch_view(row: Any) -> bs.Batch:
    """A batch row as the API shows it."""
    return bs.Batch(**engine.batch_view_fields(row))


async def _create(
    db: Database,
    settings: Settings,
    principal: Principal,
    action: BatchAction,
    body: bs.BulkRequest,
    response: Response,
    params: dict[str, Any],
) -> bs.Batch | bs.BulkDryRun:
    selection: dict[str, Any] = {}
    if body.run_ids is not None:
        selection["run_ids"] = [str(r) for r in body.run_ids]
    if body.filter is not None:
        selection["filter"] = body.filter.model_dump(mode="json", exclude_none=True)
    result = await engine.create_batch(
        db,
        settings,
        principal=principal,
        action=action,
        run_ids=body.run_ids,
        filters=_filters(body.filter) if body.filter is not None else None,
        selection=selection,
        params=params,
        reason=body.reason,
        dry_run=body.dry_run,
    )
    if isinstance(result, DryRun):
        response.status_code = 200
        return bs.BulkDryRun(matched=result.matched, sample=result.sample)
    response.headers["Location"] = f"/batches/{result['batch_id']}"
    return batch_view(result)


_RESPONSES: dict[int | str, dict[str, Any]] = {
    **PROBLEM_RESPONSES,
    200: {"model": bs.BulkDryRun, "description": "Dry run: the count and a sample"},
}
_DOC = """

Give `run_ids` (at most 1000) or `filter` (the `GET /runs` filters, evaluated once,
now). Needs the scope of the single-run action (`POST /runs/{id}/<action>`), checked
here (403, nothing stored, dry runs included) and again for each run when a worker acts
on it, under the caller's stored scopes, tenant, API key and access. 202 with the batch
(`Location: /batches/{id}`); workers then act on each run exactly as the single-run
action would and count it done, skipped (by reason) or failed (a refused check: code
`forbidden`, `tenant_suspended` or `api_key_revoked`). `dry_run: true` answers 200 with
the count and up to 20 run ids and creates nothing. 422 for both or neither of `run_ids` and
`filter`, or a filter matching more than `TREADLE_BATCH_MAX_RUNS` runs.
"""


def _route(action: BatchAction, summary: str) -> None:
    async def bulk(
        body: bs.BulkRequest,
        principal: Principal,
        db: DB,
        settings: SettingsDep,
        response: Response,
    ) -> bs.Batch | bs.BulkDryRun:
        return await _create(db, settings, principal, action, body, response, {})

    # Each verb's principal needs its single action's scope (ACTION_SCOPES). Set as an
    # object, not written in the signature: this module's annotations are strings, which
    # FastAPI resolves in the module's globals, where ``action`` is not.
    bulk.__annotations__["principal"] = Annotated[
        Principal, Depends(require_action(action.run_action))
    ]
    # The scope named in the spec is the table's, never restated by hand.
    bulk.__doc__ = f"{summary[:-1]} (scope `{action.scope.value}`)." + _DOC
    bulk.__name__ = f"bulk_{action.value}"
    router.add_api_route(
        f"/runs:{action.value}",
        bulk,
        methods=["POST"],
        operation_id=f"bulk_{action.value}",
        status_code=202,
        response_model=bs.Batch | bs.BulkDryRun,
        responses=_RESPONSES,
        tags=["batches"],
    )


_route(BatchAction.CANCEL, "Cancel many runs; terminal ones are skipped.")
_route(BatchAction.RETRY, "Retry many failed runs from their failed point.")
_route(BatchAction.RESUME, "Make many waiting runs due now.")
_route(BatchAction.PAUSE, "Pause many live runs.")
_route(BatchAction.UNPAUSE, "Unpause many paused runs.")


@router.post(
    "/runs:signal",
    operation_id="bulk_signal",
    status_code=202,
    response_model=bs.Batch | bs.BulkDryRun,
    responses=_RESPONSES,
)
async def bulk_signal(
    body: bs.BulkSignalRequest,
    principal: Signals,
    db: DB,
    settings: SettingsDep,
    response: Response,
) -> bs.Batch | bs.BulkDryRun:
    """Send the signal `name` (with `payload`) to many runs (scope `signals:write`).

    Each run buffers it as if sent by `POST /runs/{id}/signals/{name}`; finished runs are
    skipped. The payload is checked against `TREADLE_MAX_PAYLOAD_BYTES` once, up front (413).
    """
    json.dumps_limited(body.payload, settings.max_payload_bytes, "signal payload")
    params = {"name": body.name, "payload": body.payload}
    return await _create(db, settings, principal, BatchAction.SIGNAL, body, response, params)


bulk_signal.__doc__ = (bulk_signal.__doc__ or "") + _DOC


def _batch_id(batch_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(batch_id)
    except ValueError:
        raise BatchNotFound(f"batch {batch_id[:100]!r} not found") from None


@router.get(
    "/batches",
    operation_id="list_batches",
    response_model=bs.BatchPage,
    responses=PROBLEM_RESPONSES,
)
async def list_batches(
    principal: RunsRead,
    db: DB,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> bs.BatchPage:
    """The caller's bulk-action batches, newest first (scope `runs:read`).

    A batch is its creator's, as an owner-policy run is; an admin sees the tenant's all.
    """
    before = None
    if page_token:
        position = decode_token(page_token, principal.tenant_id, "batches", {})
        try:
            before = uuid.UUID(str(position))
        except ValueError:
            raise BadRequest("page_token is malformed") from None
    rows = await engine.list_batches(
        db,
        tenant_id=principal.tenant_id,
        before=before,
        limit=limit + 1,
        owner=principal.owner_filter,
    )
    token = None
    if len(rows) > limit:
        token = encode_token(principal.tenant_id, "batches", {}, str(rows[limit - 1]["batch_id"]))
    return bs.BatchPage(items=[batch_view(r) for r in rows[:limit]], next_page_token=token)


@router.get(
    "/batches/{batch_id}",
    operation_id="get_batch",
    response_model=bs.Batch,
    responses=PROBLEM_RESPONSES,
)
async def get_batch(batch_id: str, principal: RunsRead, db: DB) -> bs.Batch:
    """A batch and its progress (scope `runs:read`).

    404 for another tenant's, and for a non-admin, for a batch another subject created.
    """
    row = await engine.get_batch(
        db,
        tenant_id=principal.tenant_id,
        batch_id=_batch_id(batch_id),
        owner=principal.owner_filter,
    )
    return batch_view(row)


@router.post(
    "/batches/{batch_id}/cancel",
    operation_id="cancel_batch",
    response_model=bs.Batch,
    responses={
        **PROBLEM_RESPONSES,
        409: {"model": schemas.Problem, "description": "The batch already completed"},
    },
)
async def cancel_batch(batch_id: str, principal: RunsWrite, db: DB) -> bs.Batch:
    """Stop a running batch (scope `runs:write`): no further run is acted on.

    Runs already acted on stay so. Idempotent on a cancelled batch; 409 once completed.
    """
    row = await engine.cancel_batch(
        db,
        tenant_id=principal.tenant_id,
        batch_id=_batch_id(batch_id),
        owner=principal.owner_filter,
    )
    return batch_view(row)
