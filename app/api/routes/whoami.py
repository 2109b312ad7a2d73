"""``/whoami``: the principal a token authenticates as (the console's sign-in check)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from app.api import schemas
from app.api.deps import get_principal
from app.api.problems import PROBLEM_RESPONSES
from app.auth.principal import Principal

router = APIRouter(tags=["auth"])


@router.get(
    "/whoami",
    operation_id="whoami",
    response_model=schemas.WhoAmI,
    responses={k: v for k, v in PROBLEM_RESPONSES.items() if k in (401, 403)},
)
async def whoami(principal: Annotated[Principal, Depends(get_principal)]) -> schemas.WhoAmI:
    """The tenant, subject, scopes and groups of the bearer token.

    Needs no scope: any token the API accepts may ask who it is (the console signs in
    with it). 401 for a missing, malformed, expired or forged token; 403 for a token of a
    suspended tenant.
    """
    return schemas.WhoAmI(
        tenant_id=principal.tenant_id,
        subject=principal.subject,
        scopes=sorted(s.value for s in principal.scopes),
        groups=sorted(principal.groups),
        api_key=principal.api_key_id is not None,
    )
