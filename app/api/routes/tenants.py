"""``/admin/tenants``: suspend and resume whole tenants, for operators (scope ``admin``)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query

from app.api import schemas
from app.api.deps import Admin, TenantsDep, audit_log
from app.api.pagination import decode_token, encode_token
from app.api.problems import PROBLEM_RESPONSES
from app.core.errors import BadRequest
from app.core.ids import is_tenant_id
from app.engine.tenants import TenantState

router = APIRouter(prefix="/admin/tenants", tags=["admin"])

TenantPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="The tenant id, as in tokens' tenant claim: 1..128 of `[A-Za-z0-9_.-]`.",
    ),
]


def _view(state: TenantState) -> schemas.Tenant:
    return schemas.Tenant(
        tenant=state.tenant_id,
        status=schemas.TenantStatus(state.status),
        reason=state.reason,
        changed_by=state.changed_by,
        changed_at=state.changed_at,
        created_at=state.created_at,
    )


@router.get(
    "",
    operation_id="list_tenants",
    response_model=schemas.TenantPage,
    responses=PROBLEM_RESPONSES,
)
async def list_tenants(
    principal: Admin,
    service: TenantsDep,
    status: Literal["suspended", "all"] = "all",
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> schemas.TenantPage:
    """Tenants an operator has suspended (now or before), by id, across the deployment.

    A tenant never suspended has no entry and is active. ``status=suspended`` lists only
    those suspended now. Paginated like every list (``page_token``, ``limit`` ≤ 200).
    """
    filters = {"status": status}
    after = None
    if page_token:
        after = decode_token(page_token, principal.tenant_id, "tenants", filters)
        if not is_tenant_id(after):
            raise BadRequest("page_token is malformed")
    audit_log.info("admin tenant list", subject=principal.subject)
    states = await service.list_tenants(
        status=None if status == "all" else status, after=after, limit=limit + 1
    )
    token = None
    if len(states) > limit:
        token = encode_token(principal.tenant_id, "tenants", filters, states[limit - 1].tenant_id)
    return schemas.TenantPage(items=[_view(s) for s in states[:limit]], next_page_token=token)


@router.post(
    "/{tenant}/suspend",
    operation_id="suspend_tenant",
    response_model=schemas.Tenant,
    responses=PROBLEM_RESPONSES,
)
async def suspend_tenant(
    tenant: TenantPath,
    body: schemas.SuspendTenantRequest,
    principal: Admin,
    service: TenantsDep,
) -> schemas.Tenant:
    """Suspend a tenant: its requests are refused and its runs fail at their next attempt.

    From then on every request of the tenant's principals is ``403`` with code
    ``tenant_suspended`` (naming the tenant, never the ``reason``), except principals
    holding ``admin``. API processes other than this one notice within
    ``TREADLE_TENANT_CACHE_SECONDS``. Each run of the tenant ends ``failed`` /
    ``failure_authorization`` at its next worker attempt (queued runs at once, waiting
    runs when they wake), payloads redacted, a dead letter written.

    Idempotent: suspending a suspended tenant changes nothing and returns its state
    (with the first reason). The tenant needs no prior existence. Audited
    (``treadle.audit``) with the caller's subject.
    """
    state = await service.suspend(tenant_id=tenant, reason=body.reason, actor=principal.subject)
    return _view(state)


@router.post(
    "/{tenant}/resume",
    operation_id="resume_tenant",
    response_model=schemas.Tenant,
    responses=PROBLEM_RESPONSES,
)
async def resume_tenant(
    tenant: TenantPath, principal: Admin, service: TenantsDep
) -> schemas.Tenant:
    """Resume a suspended tenant: its requests and new runs work again.

    Runs that failed while it was suspended stay failed; requeue their dead letters
    (``POST /dead-letters/{id}/requeue``) to run them from their failed point.
    Idempotent: resuming an active tenant changes nothing. Audited (``treadle.audit``).
    """
    return _view(await service.resume(tenant_id=tenant, actor=principal.subject))
