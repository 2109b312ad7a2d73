"""``/admin/api-keys``: per-tenant API keys, for operators (scope ``admin``)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import RowMapping

from app.api import schemas
from app.api.deps import Admin, ApiKeysDep, audit_log
from app.api.problems import PROBLEM_RESPONSES
from app.auth.principal import Principal
from app.core.errors import ApiKeyNotFound

router = APIRouter(prefix="/admin/api-keys", tags=["admin"])

TenantQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="The tenant whose keys to manage; default the caller's.",
    ),
]


def _view(row: RowMapping) -> schemas.ApiKey:
    return schemas.ApiKey(
        key_id=row["key_id"],
        tenant=row["tenant_id"],
        name=row["name"],
        prefix=row["prefix"],
        scopes=row["scopes"].split(),
        created_by=row["created_by"],
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
        revoked_by=row["revoked_by"],
        last_used_at=row["last_used_at"],
    )


def _tenant(principal: Principal, tenant: str | None, action: str) -> str:
    chosen = tenant or principal.tenant_id
    if chosen != principal.tenant_id:
        audit_log.info(f"admin {action} across tenants", subject=principal.subject, tenant=chosen)
    return chosen


@router.post(
    "",
    operation_id="create_api_key",
    status_code=201,
    response_model=schemas.ApiKeyCreated,
    responses=PROBLEM_RESPONSES,
)
async def create_api_key(
    body: schemas.CreateApiKeyRequest, principal: Admin, service: ApiKeysDep
) -> schemas.ApiKeyCreated:
    """Create an API key for a tenant (the caller's unless ``tenant`` is given).

    The response's ``api_key`` (``trd_<prefix>_<secret>``) is shown this once: only its
    SHA-256 is stored. Use it as ``Authorization: Bearer <api_key>``.
    """
    tenant = _tenant(principal, body.tenant, "api key creation")
    created = await service.create(
        tenant_id=tenant, name=body.name, scopes=body.scopes, created_by=principal.subject
    )
    return schemas.ApiKeyCreated(**_view(created.row).model_dump(), api_key=created.token)


@router.get(
    "",
    operation_id="list_api_keys",
    response_model=schemas.ApiKeyList,
    responses=PROBLEM_RESPONSES,
)
async def list_api_keys(
    principal: Admin,
    service: ApiKeysDep,
    tenant: TenantQuery = None,
    include_revoked: bool = True,
) -> schemas.ApiKeyList:
    """A tenant's API keys, oldest first (metadata only; secrets are never shown again)."""
    rows = await service.list_keys(
        _tenant(principal, tenant, "api key read"), include_revoked=include_revoked
    )
    return schemas.ApiKeyList(items=[_view(r) for r in rows])


@router.delete(
    "/{key_id}",
    operation_id="revoke_api_key",
    response_model=schemas.ApiKey,
    responses=PROBLEM_RESPONSES,
)
async def revoke_api_key(
    key_id: str, principal: Admin, service: ApiKeysDep, tenant: TenantQuery = None
) -> schemas.ApiKey:
    """Revoke a key now (idempotent).

    The key is looked up in the caller's tenant, or in ``?tenant=`` when given, as
    ``GET /admin/api-keys`` lists them and ``POST`` creates them (``tenant`` in the
    body): to revoke another tenant's key, pass its tenant (the key's ``tenant`` field).
    A key that is not in that tenant is ``404 api_key_not_found``, whose ``detail``
    names the tenant searched and says to pass ``?tenant=``; a missing key and another
    tenant's answer alike.

    Requests with it get 401 from then on, and the runs it submitted end ``failed`` /
    ``failure_authorization`` at their next worker attempt.
    """
    chosen = _tenant(principal, tenant, "api key revocation")
    # One refusal for a malformed id, a missing key and another tenant's key (the
    # tenant-scoped query decides; nothing tells them apart): it says where it looked.
    hint = "" if tenant else "; a key of another tenant needs ?tenant=<its tenant>"
    not_found = ApiKeyNotFound(
        f"API key {key_id[:100]!r} not found in tenant {chosen!r}{hint}", key_id=key_id[:100]
    )
    try:
        kid = uuid.UUID(key_id)
    except ValueError:
        raise not_found from None
    try:
        row = await service.revoke(tenant_id=chosen, key_id=kid, actor=principal.subject)
    except ApiKeyNotFound:
        raise not_found from None
    return _view(row)
