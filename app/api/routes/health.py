"""Liveness and readiness probes (no authentication)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api import schemas
from app.api.deps import DB, PUBLIC
from app.api.problems import HEADERS_TOO_LARGE
from app.core.errors import SchemaVersionMismatch
from app.db.migrations import check_schema

router = APIRouter(tags=["health"])

# Load balancers and uptime checkers probe with HEAD: each probe answers HEAD as GET
# (same status and headers, no body: the server drops it). FastAPI routes take only the
# methods they list, so HEAD is a second route of the same function, outside the
# OpenAPI document (the GET operation says it; docs/api.md, "Health").


@router.head("/healthz", include_in_schema=False)
@router.get(
    "/healthz",
    operation_id="get_health",
    response_model=schemas.Health,
    responses=HEADERS_TOO_LARGE,
    openapi_extra=PUBLIC,
)
async def healthz() -> schemas.Health:
    """Liveness: the process answers (``HEAD /healthz`` too: the status alone)."""
    return schemas.Health(status="ok")


@router.head("/readyz", include_in_schema=False)
@router.get(
    "/readyz",
    operation_id="get_readiness",
    response_model=schemas.Health,
    responses={503: {"model": schemas.Health, "description": "Not ready"}, **HEADERS_TOO_LARGE},
    openapi_extra=PUBLIC,
)
async def readyz(db: DB) -> JSONResponse:
    """Readiness: the database is reachable and its schema is at this code's head.

    ``HEAD /readyz`` answers the same status (200 or 503) without a body.
    """
    try:
        await check_schema(db)
    except SchemaVersionMismatch as exc:
        body = schemas.Health(status="unavailable", detail=exc.detail)
        return JSONResponse(body.model_dump(), status_code=503)
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
        body = schemas.Health(
            status="unavailable", detail=f"database unreachable: {type(exc).__name__}"
        )
        return JSONResponse(body.model_dump(), status_code=503)
    return JSONResponse(schemas.Health(status="ok").model_dump())
