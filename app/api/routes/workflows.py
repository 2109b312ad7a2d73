"""``/workflows``: registered definitions and the workers that run them."""

from __future__ import annotations

from fastapi import APIRouter

from app.api import schemas
from app.api.deps import DB, RunsRead, SettingsDep
from app.api.problems import PROBLEM_RESPONSES
from app.core import json
from app.db.queries import definitions as defs_q
from app.db.queries import runs as runs_q
from app.db.queries import slots as slots_q
from app.sdk.queue import QueueControls

router = APIRouter(prefix="/workflows", tags=["workflows"])


@router.get(
    "",
    operation_id="list_workflows",
    response_model=schemas.WorkflowList,
    responses={k: v for k, v in PROBLEM_RESPONSES.items() if k in (401, 403)},
)
async def list_workflows(
    principal: RunsRead, db: DB, settings: SettingsDep
) -> schemas.WorkflowList:
    """Every registered workflow with its versions, JSON Schemas and live workers.

    A worker is live if it heartbeated within two lease TTLs and has not stopped. Per
    version, ``open_runs`` counts the caller's runs not yet finished (so an old version
    can be retired once it reaches 0), ``blocked_runs`` those among them that need a
    worker while no live worker registered the version, and ``queued_for_slot`` those
    waiting for a slot of their concurrency key (``queue_controls.on_limit`` = queue).
    """
    # May lag (docs/adr/0033-lag-tolerant-reads-on-a-replica.md): a worker that registered
    # a moment ago can be missing; submits check the registry on the primary.
    async with db.lagging_read() as conn:
        rows = await defs_q.list_definitions(conn)
        workers = await defs_q.live_workers(conn, within_seconds=2 * settings.lease_ttl_seconds)
        open_runs = await runs_q.count_open_by_version(conn, tenant_id=principal.tenant_id)
        claimable = await runs_q.count_open_by_version(
            conn, tenant_id=principal.tenant_id, claimable_only=True
        )
        waiting = await slots_q.count_waiting_by_version(conn, tenant_id=principal.tenant_id)
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
                access=r["access"],
                input_schema=json.loads(r["input_schema"]),
                output_schema=json.loads(r["output_schema"]),
                states=json.loads(r["states"]),
                graph=json.loads(r["graph"]),
                queue_controls=schemas.QueueControlsView.model_validate(
                    QueueControls.from_json(json.loads(r["queue_controls"])).to_json()
                ),
                on_event=r["on_event"],
                event_filter=json.loads(r["event_filter"]),
                first_registered_at=r["first_registered_at"],
                last_registered_at=r["last_registered_at"],
                live_workers=sorted(runs_by_key.get(f"{r['name']}@{r['version']}", [])),
                open_runs=open_runs.get((r["name"], r["version"]), 0),
                blocked_runs=0
                if f"{r['name']}@{r['version']}" in runs_by_key
                else claimable.get((r["name"], r["version"]), 0),
                queued_for_slot=waiting.get((r["name"], r["version"]), 0),
            )
        )
    return schemas.WorkflowList(
        items=[
            schemas.Workflow(name=name, versions=list(reversed(versions)))
            for name, versions in by_name.items()
        ]
    )
