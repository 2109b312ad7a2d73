"""``/workflows``: registered definitions and the workers that run them."""

from __future__ import annotations

from fastapi import APIRouter

from app.api import schemas
from app.api.deps import DB, RunsRead, SettingsDep
from app.api.problems import PROBLEM_RESPONSES
from app.core import json
from app.db.queries import definitions as defs_q

router = APIRouter(prefix="/workflows", tags=["workflows"])


@router.get(
    "",
    operation_id="list_workflows",
    response_model=schemas.WorkflowList,
    responses={k: v for k, v in PROBLEM_RESPONSES.items() if k in (401, 403)},
)
async def list_workflows(_: RunsRead, db: DB, settings: SettingsDep) -> schemas.WorkflowList:
    """Every registered workflow with its versions, JSON Schemas and live workers.

    A worker is live if it heartbeated within two lease TTLs and has not stopped.
    """
    async with db.read() as conn:
        rows = await defs_q.list_definitions(conn)
        workers = await defs_q.live_workers(conn, within_seconds=2 * settings.lease_ttl_seconds)
    runs_by_key: dict[str, list[str]] = {}
    for w in workers:
        for key in json.loads(w["definitions"]):
            runs_by_key.setdefault(key, []).append(w["worker_id"])
    by_name: dict[str, list[schemas.WorkflowVersion]] = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(
            schemas.WorkflowVersion(
                version=r["version"],
                kind=r["kind"],
                input_schema=json.loads(r["input_schema"]),
                output_schema=json.loads(r["output_schema"]),
                states=json.loads(r["states"]),
                first_registered_at=r["first_registered_at"],
                last_registered_at=r["last_registered_at"],
                live_workers=sorted(runs_by_key.get(f"{r['name']}@{r['version']}", [])),
            )
        )
    return schemas.WorkflowList(
        items=[
            schemas.Workflow(name=name, versions=list(reversed(versions)))
            for name, versions in by_name.items()
        ]
    )
