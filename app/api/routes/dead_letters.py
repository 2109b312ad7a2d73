"""``/dead-letters``: terminal failures awaiting an operator, and their requeue."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from sqlalchemy import select

from app.api import schemas
from app.api.deps import DB, Requeues, RunsRead, TenantQuery, read_tenant
from app.api.pagination import decode_token, encode_token
from app.api.problems import PROBLEM_RESPONSES
from app.api.views import dead_letter_view
from app.core.errors import BadRequest, DeadLetterNotFound
from app.db.queries.runs import visible_to
from app.db.tables import dead_letters, runs
from app.engine import control

router = APIRouter(prefix="/dead-letters", tags=["dead letters"])


def _parse_id(dead_letter_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(dead_letter_id)
    except ValueError:
        raise DeadLetterNotFound(f"dead letter {dead_letter_id[:100]!r} not found") from None


@router.get(
    "",
    operation_id="list_dead_letters",
    response_model=schemas.DeadLetterPage,
    responses=PROBLEM_RESPONSES,
)
async def list_dead_letters(
    principal: RunsRead,
    db: DB,
    status: Literal["pending", "all"] = "pending",
    workflow: Annotated[str | None, Query(max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")] = None,
    page_token: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    tenant: TenantQuery = None,
) -> schemas.DeadLetterPage:
    """The tenant's dead letters, newest first (``status=pending`` by default, or ``all``).

    Dead letters of ``owner``-policy runs appear only to the run's submitter.
    """
    tenant_id = read_tenant(principal, tenant)
    filters = {"status": status, "workflow": workflow}
    stmt = select(dead_letters).where(dead_letters.c.tenant_id == tenant_id)
    owner = principal.owner_filter
    if owner is not None:
        stmt = stmt.where(
            dead_letters.c.run_id.in_(
                select(runs.c.run_id).where(runs.c.tenant_id == tenant_id, visible_to(owner))
            )
        )
    if status == "pending":
        stmt = stmt.where(dead_letters.c.status == "pending")
    if workflow:
        stmt = stmt.where(dead_letters.c.workflow == workflow)
    if page_token:
        position = decode_token(page_token, tenant_id, "dead-letters", filters)
        try:
            stmt = stmt.where(dead_letters.c.dead_letter_id < uuid.UUID(str(position)))
        except ValueError:
            raise BadRequest("page_token is malformed") from None
    stmt = stmt.order_by(dead_letters.c.dead_letter_id.desc()).limit(limit + 1)
    # May lag (docs/adr/0033-lag-tolerant-reads-on-a-replica.md); a requeue decides on
    # the primary, whatever this page showed.
    async with db.lagging_read() as conn:
        rows = (await conn.execute(stmt)).mappings().all()
    token = None
    if len(rows) > limit:
        token = encode_token(
            tenant_id, "dead-letters", filters, str(rows[limit - 1]["dead_letter_id"])
        )
    return schemas.DeadLetterPage(
        items=[dead_letter_view(r) for r in rows[:limit]], next_page_token=token
    )


@router.post(
    "/{dead_letter_id}/requeue",
    operation_id="requeue_dead_letter",
    response_model=schemas.DeadLetter,
    responses={
        **PROBLEM_RESPONSES,
        409: {"model": schemas.Problem, "description": "Already requeued"},
    },
)
async def requeue_dead_letter(
    dead_letter_id: str, body: schemas.RequeueRequest, principal: Requeues, db: DB
) -> schemas.DeadLetter:
    """Re-run the failed run from its failed point; audited with who, why, correlation id.

    Failed steps start over, succeeded ones replay from the journal. 409 if already
    requeued.
    """
    row = await control.requeue_dead_letter(
        db,
        tenant_id=principal.tenant_id,
        dead_letter_id=_parse_id(dead_letter_id),
        actor=principal.subject,
        reason=body.reason,
        correlation_id=body.correlation_id,
        owner=principal.owner_filter,
    )
    return dead_letter_view(row)
