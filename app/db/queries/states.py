"""State machines: a run's typed current state, read from its journal."""

from __future__ import annotations

from typing import Any

from sqlalchemy import RowMapping, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.status import STATE_MACHINE_KIND, TRANSITION_STEP_PREFIX, RunReason, StepStatus
from app.db.tables import steps, workflow_definitions


async def current_state(conn: AsyncConnection, run: RowMapping) -> dict[str, Any] | None:
    """``{"name", "fields"}`` of a state-machine run's last committed state, else None.

    The journal is the state's only store: the output of the latest succeeded transition
    step, or the registered initial state before the first one. None for runs of other
    kinds, and for a corrupt state: a run that ended ``failure_corrupt_state`` (the worker
    could not decode its journaled state), or a journaled state that is not a
    ``{name, fields}`` object naming one of the definition's registered states. An
    undecodable state is withheld rather than shown half-valid (docs/api.md, ``state``).
    """
    if run["reason"] == RunReason.FAILURE_CORRUPT_STATE.value:
        return None
    definition = (
        await conn.execute(
            select(workflow_definitions.c.kind, workflow_definitions.c.states).where(
                workflow_definitions.c.name == run["workflow"],
                workflow_definitions.c.version == run["version"],
            )
        )
    ).first()
    if definition is None or definition.kind != STATE_MACHINE_KIND:
        return None
    output = (
        await conn.execute(
            select(steps.c.output)
            .where(
                steps.c.run_id == run["run_id"],
                steps.c.tenant_id == run["tenant_id"],
                steps.c.kind == "transaction",
                steps.c.status == StepStatus.SUCCEEDED.value,
                steps.c.step_id.startswith(TRANSITION_STEP_PREFIX, autoescape=True),
            )
            .order_by(steps.c.seq.desc())
            .limit(1)
        )
    ).scalar()
    registered = json.loads(definition.states) or []
    if output is None:
        initial = [s for s in registered if s.get("initial")]
        return {"name": initial[0]["name"], "fields": {}} if initial else None
    try:
        value = json.loads(output)
    except ValueError:  # not even JSON: as corrupt as an unknown variant
        return None
    if (
        isinstance(value, dict)
        and isinstance(value.get("name"), str)
        and isinstance(value.get("fields"), dict)
        and value["name"] in {s.get("name") for s in registered}
    ):
        return {"name": value["name"], "fields": value["fields"]}
    return None
