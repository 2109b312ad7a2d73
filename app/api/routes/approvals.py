"""``/approvals``: the waiting approvals the caller may decide (the approver's inbox)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from app.api import schemas
from app.api.deps import DB, ApprovalsWrite
from app.api.pagination import decode_token, encode_token
from app.api.problems import PROBLEM_RESPONSES
from app.auth.principal import Principal
from app.core import json
from app.core.errors import BadRequest
from app.db.queries import approvals as approvals_q

router = APIRouter(prefix="/approvals", tags=["approvals"])

# Rows read per database round trip while filtering by group (groups live in JSON text).
_BATCH = 200


def _position(token: str | None, tenant_id: str, filters: dict[str, Any]) -> Any:
    if not token:
        return None
    raw = decode_token(token, tenant_id, "approvals", filters)
    try:
        at, run_id, step_id = raw
        return datetime.fromisoformat(at), uuid.UUID(run_id), str(step_id)
    except (TypeError, ValueError):
        raise BadRequest("page_token is malformed") from None


def _decidable(row: Any, principal: Principal) -> schemas.PendingApproval | None:
    detail = json.loads(row["detail"]) if row["detail"] else {}
    detail = detail if isinstance(detail, dict) else {}
    group = detail.get("group")
    if group and group not in principal.groups:
        return None
    needed = int(detail.get("approvals", 1))
    given = int(row["approvals_given"])
    if row["rejections"] or given >= needed:
        return None  # decided; the run has not resumed to record it yet
    return schemas.PendingApproval(
        run_id=row["run_id"],
        step_id=row["step_id"],
        name=row["name"],
        workflow=row["workflow"],
        version=row["version"],
        group=group,
        payload=detail.get("payload"),
        approvals_needed=needed,
        approvals_given=given,
        remaining=needed - given,
        self_approval=bool(detail.get("self_approval", False)),
        submitted_by=row["created_by"],
        deadline=row["deadline"],
        waiting_since=row["created_at"],
    )


@router.get(
    "",
    operation_id="list_pending_approvals",
    response_model=schemas.ApprovalPage,
    responses=PROBLEM_RESPONSES,
)
async def list_pending_approvals(
    principal: ApprovalsWrite,
    db: DB,
    workflow: Annotated[str | None, Query(max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")] = None,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> schemas.ApprovalPage:
    """Every waiting approval the caller may decide, oldest first (``approvals:write``).

    Listed: approvals still waiting on open runs of the caller's tenant that the caller
    may read (owner-policy runs only for their submitter, as everywhere), whose group is
    one of the token's ``groups`` (or that name no group), still needing decisions, and
    that the caller has not decided yet. Each item carries the approval's ``payload``,
    ``deadline`` and how many approvals it still needs (``remaining`` of
    ``approvals_needed``). An approval of a run the caller submitted is listed with
    ``self_approval`` false: deciding it is refused (403), as ``POST
    /runs/{run_id}/approvals/{step_id}`` says. Keyset-paged like every list.
    """
    filters = {"workflow": workflow}
    after = _position(page_token, principal.tenant_id, filters)
    items: list[schemas.PendingApproval] = []
    last_scanned = after
    more = False
    async with db.read() as conn:
        while True:
            rows = await approvals_q.list_waiting(
                conn,
                principal.tenant_id,
                subject=principal.subject,
                owner=principal.owner_filter,
                workflow=workflow,
                after=last_scanned,
                limit=_BATCH,
            )
            for row in rows:
                item = _decidable(row, principal)
                if item is None:
                    last_scanned = (row["created_at"], row["run_id"], row["step_id"])
                    continue
                if len(items) == limit:
                    more = True
                    break
                items.append(item)
                last_scanned = (row["created_at"], row["run_id"], row["step_id"])
            if more or len(rows) < _BATCH:
                break
    token = None
    if more and items:
        last = items[-1]
        position = [last.waiting_since.isoformat(), str(last.run_id), last.step_id]
        token = encode_token(principal.tenant_id, "approvals", filters, position)
    return schemas.ApprovalPage(items=items, next_page_token=token)
