"""``/admin/maintenance``: the maintenance tiers on the whole deployment (scope ``admin``)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api import schemas
from app.api.deps import DB, Admin, SettingsDep
from app.api.problems import PROBLEM_RESPONSES
from app.engine.maintenance import Tier, run_maintenance

router = APIRouter(prefix="/admin", tags=["admin"])


@router.post(
    "/maintenance",
    operation_id="run_maintenance",
    response_model=schemas.MaintenanceReport,
    responses=PROBLEM_RESPONSES,
)
async def post_maintenance(
    body: schemas.MaintenanceRequest, principal: Admin, db: DB, settings: SettingsDep
) -> schemas.MaintenanceReport:
    """Run the maintenance tiers now, or dry-run them (scope ``admin``).

    Compaction clears the payloads of runs finished more than
    ``TREADLE_COMPACTION_AFTER_DAYS`` ago; archival moves runs finished more than
    ``TREADLE_ARCHIVAL_AFTER_DAYS`` ago to the archive (reads of them then answer 404 with
    code ``run_archived``); audit trimming deletes events and dead letters of finished runs
    older than ``TREADLE_AUDIT_RETENTION_DAYS`` and applies every other table's retention
    rule (archived summaries, webhook deliveries and attempts, inbound events, batches and
    their items, schedule fires, workers, console sessions, rate-limit buckets: see
    docs/operations.md). Live runs are never touched. The work spans
    every tenant (it is the deployment's housekeeping) and answers counts only. A dry run
    does the same work in a transaction that is rolled back, so its counts are exact.
    The request returns when the work is done (batches of
    ``TREADLE_MAINTENANCE_BATCH_SIZE``); for large backlogs prefer
    ``treadle maintenance run`` from a job.
    """
    tiers = [Tier(t.value) for t in body.tiers]
    report = await run_maintenance(db, settings, tiers=tiers, dry_run=body.dry_run)
    return schemas.MaintenanceReport.model_validate(report.as_dict())
