"""Test kit: unit-test workflows in-process, on a throwaway database, with a virtual clock.

:class:`WorkflowTestEnv` drives the real engine (the :class:`~app.worker.worker.Worker`
claim loop, the replay executor, fenced checkpoints) against a fresh, migrated SQLite file
in a temporary directory. Nothing is re-implemented or mocked: a run goes through exactly
the statements it goes through in production.

Time is virtual. Timers, retry back-offs, wait deadlines and leases are computed on the
*database* clock (DESIGN §5), which on SQLite is ``strftime(…, 'now')``
(:mod:`app.db.dialect`). The kit overrides the ``strftime`` SQL function on its own
connections only (SQLite lets an application function replace a built-in one per
connection, see https://sqlite.org/appfunc.html), so ``'now'`` reads a
:class:`VirtualClock`: real time plus an offset that :meth:`WorkflowTestEnv.skip` moves
forward. A three-day approval timeout is therefore one ``skip`` away, and production code
paths and their speed are untouched: no engine module knows about the kit.

Example::

    async with WorkflowTestEnv([onboard]) as env:
        run = await env.start(onboard, Applicant(...))
        await env.approve(run, "manager", groups=["sales-manager"])
        await env.signal(run, "docs_uploaded", {"files": ["id.pdf"], "tax_id": "T1"})
        result = await env.result(run)

Every action (``start``, ``signal``, ``approve``, ``reject``, ``cancel``, ``skip``) returns
once the engine is idle again: nothing is executing and nothing is due at the virtual
time. :meth:`WorkflowTestEnv.result` additionally skips the clock from timer to timer until
the run finishes, as Temporal's time-skipping test server does.
"""

# The domain errors the kit's actions raise (their docstrings' ``Raises:``), importable
# from here so a test needs one import (docs/authoring.md, "Testing workflows").
from app.core.errors import (
    Forbidden,
    IdempotencyConflict,
    InvalidInput,
    InvalidState,
    RunFinished,
    RunNotFound,
    StepNotFound,
    TreadleError,
    WorkflowNotFound,
)
from app.core.status import RunStatus, StepStatus
from app.sdk.testing.clock import VirtualClock
from app.sdk.testing.env import (
    EmitSnapshot,
    EventSnapshot,
    LogSnapshot,
    RunBlocked,
    RunHandle,
    RunNotCompleted,
    RunSnapshot,
    StepSnapshot,
    WorkflowTestEnv,
)

__all__ = [
    "EmitSnapshot",
    "EventSnapshot",
    "Forbidden",
    "IdempotencyConflict",
    "InvalidInput",
    "InvalidState",
    "LogSnapshot",
    "RunBlocked",
    "RunFinished",
    "RunHandle",
    "RunNotCompleted",
    "RunNotFound",
    "RunSnapshot",
    "RunStatus",
    "StepNotFound",
    "StepSnapshot",
    "StepStatus",
    "TreadleError",
    "VirtualClock",
    "WorkflowNotFound",
    "WorkflowTestEnv",
]
