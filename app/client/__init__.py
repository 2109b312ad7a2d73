"""First-party Python clients of the Treadle HTTP API (docs/clients.md).

:class:`TreadleClient` (sync) and :class:`AsyncTreadleClient` (asyncio), both on httpx,
return typed models (:mod:`app.client.models`) and raise :class:`TreadleAPIError` for
every error answer. They import nothing of the server (engine, database, API): only
``app.core``'s vocabulary (statuses, reasons, the error base).
"""

from app.client._http import segment as quote_segment
from app.client.aio import AsyncTreadleClient
from app.client.errors import RunFailed, RunNotFinished, TreadleAPIError, TreadleUnreachable
from app.client.models import (
    ApprovalDecision,
    DeadLetter,
    DeadLetterPage,
    Event,
    EventPage,
    Run,
    RunPage,
    RunReport,
    RunResult,
    SignalAccepted,
    Step,
    StepPage,
    Workflow,
    WorkflowList,
)
from app.client.sync import TreadleClient

__all__ = [
    "ApprovalDecision",
    "AsyncTreadleClient",
    "DeadLetter",
    "DeadLetterPage",
    "Event",
    "EventPage",
    "Run",
    "RunFailed",
    "RunNotFinished",
    "RunPage",
    "RunReport",
    "RunResult",
    "SignalAccepted",
    "Step",
    "StepPage",
    "TreadleAPIError",
    "TreadleClient",
    "TreadleUnreachable",
    "Workflow",
    "WorkflowList",
    "quote_segment",
]
