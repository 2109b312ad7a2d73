"""Every route that acts on existing runs needs the scope ``ACTION_SCOPES`` gives its verb.

Issue 34: ``POST /runs:cancel`` needed ``runs:write`` while ``POST /runs/{id}/cancel``
needs ``runs:cancel``. The routes are read from the app itself (their ``require``
dependency), so a new single or bulk action must be named here and in the table.
"""

from __future__ import annotations

from typing import Any

from fastapi.routing import APIRoute

from app.api.app import create_app
from app.auth.principal import ACTION_SCOPES, RunAction, Scope
from app.core.settings import Settings
from app.engine.batches import BatchAction
from tests.conftest import DEV_SECRET

# operation id -> the verb it performs; every bulk verb's route is ``bulk_<verb>``.
SINGLE = {
    "cancel_run": RunAction.CANCEL,
    "send_signal": RunAction.SIGNAL,
    "decide_approval": RunAction.DECIDE_APPROVAL,
    "resume_run": RunAction.RESUME,
    "retry_run": RunAction.RETRY,
    "requeue_dead_letter": RunAction.REQUEUE,
    "pause_run": RunAction.PAUSE,
    "unpause_run": RunAction.UNPAUSE,
    "rerun_run": RunAction.RERUN,
}


def _required_scope(dependant: Any) -> Scope | None:
    stack, found = list(dependant.dependencies), None
    while stack:
        dep = stack.pop()
        scope = getattr(dep.call, "required_scope", None)
        found = Scope(scope) if scope is not None else found
        stack.extend(dep.dependencies)
    return found


def _scopes_by_operation() -> dict[str, Scope | None]:
    app = create_app(
        Settings(database_url="sqlite+aiosqlite:///:memory:", dev_secret=DEV_SECRET),
        check_schema_on_start=False,
    )
    found: dict[str, Scope | None] = {}
    for route in app.routes:
        if isinstance(route, APIRoute):
            contexts: list[Any] = [route]
        else:
            # FastAPI's included routers expose their routes as effective contexts.
            contexts = list(getattr(route, "effective_route_contexts", list)())
        for ctx in contexts:
            if ctx.operation_id:
                found[ctx.operation_id] = _required_scope(ctx.dependant)
    return found


def test_single_and_bulk_routes_need_the_tables_scope() -> None:
    scopes = _scopes_by_operation()
    assert set(SINGLE.values()) == set(RunAction), "a verb without its single route"
    wrong = {
        op: (scopes.get(op), ACTION_SCOPES[verb])
        for op, verb in SINGLE.items()
        if scopes.get(op) != ACTION_SCOPES[verb]
    }
    for action in BatchAction:
        op = f"bulk_{action.value}"
        single = ACTION_SCOPES[RunAction(action.value)]
        if scopes.get(op) != single:
            wrong[op] = (scopes.get(op), single)
    assert not wrong, wrong
    # Bulk cancel needs what a single cancel needs, not runs:write (the case).
    assert scopes["bulk_cancel"] == Scope.RUNS_CANCEL == scopes["cancel_run"]


def test_every_bulk_verb_is_a_single_run_verb() -> None:
    assert {a.value for a in BatchAction} <= {v.value for v in RunAction}
    for action in BatchAction:
        assert action.scope == ACTION_SCOPES[action.run_action]
