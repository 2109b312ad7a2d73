"""OpenAPI links: the operations that take an id a response just returned.

A link (OpenAPI 3.1, "Link Object") tells clients, generated SDKs and stateful fuzzers
(schemathesis follows them) that the ``run_id`` in ``POST /runs``'s response is the
``run_id`` path parameter of ``GET /runs/{run_id}``, ``POST /runs/{run_id}/cancel`` and
so on. They are declared on the routes (``responses={201: {"links": …}}``), so the
committed spec, generated from the app, carries them.
"""

from __future__ import annotations

from typing import Any

RUN_OPERATIONS = (
    "get_run",
    "get_run_result",
    "list_run_steps",
    "list_run_events",
    "list_run_logs",
    "get_run_report",
    "cancel_run",
    "send_signal",
    "decide_approval",
    "resume_run",
    "retry_run",
    "migrate_run",
)
"""Operations under ``/runs/{run_id}``."""

SCHEDULE_OPERATIONS = (
    "get_schedule",
    "update_schedule",
    "delete_schedule",
    "pause_schedule",
    "resume_schedule",
    "trigger_schedule",
    "list_schedule_fires",
)
"""Operations under ``/schedules/{schedule_id}``."""

WEBHOOK_OPERATIONS = ("get_webhook", "delete_webhook", "list_webhook_deliveries")
"""Operations under ``/webhooks/{webhook_id}``."""

EVENT_OPERATIONS = ("get_event",)
"""Operations under ``/events/{event_id}``."""


def links_to(operation_ids: tuple[str, ...], parameter: str) -> dict[str, Any]:
    """Links from a response whose body has ``parameter`` to each of ``operation_ids``.

    Args:
        operation_ids: target operations; each takes ``parameter`` as a path parameter.
        parameter: the id's name, the same in the response body and in the paths.

    Returns:
        ``{"GetRun": {"operationId": "get_run", "parameters": {"run_id":
        "$response.body#/run_id"}}, …}``: a ``links`` map for an OpenAPI response.
    """
    return {
        "".join(part.title() for part in op.split("_")): {
            "operationId": op,
            "parameters": {parameter: f"$response.body#/{parameter}"},
            "description": f"Pass this response's `{parameter}` to {op}.",
        }
        for op in operation_ids
    }


RUN_LINKS = links_to(RUN_OPERATIONS, "run_id")
SCHEDULE_LINKS = links_to(SCHEDULE_OPERATIONS, "schedule_id")
