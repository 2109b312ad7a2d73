"""``expense-report`` upgraded in place with ``ctx.patched`` while runs wait on approvals.

The first deployment (``examples/expenses_before.py``) was prepare → approval → pay. This
version adds an audit step *before* the approval. Runs already waiting for their manager
have journaled prepare and the approval; replaying them through the new code must not
invent an audit step in the middle of their history (that would be nondeterminism:
``failure_nondeterminism``). ``ctx.patched("audit-before-approval")`` answers:

- False for those runs: their journal already went past this point without the
  marker, so they replay the old path and continue (no audit);
- True for runs that reach it on this code: the answer is journaled as a
  ``patch:audit-before-approval`` marker, so their replays take the new path too.

The version stays ``1``: the same workers serve old and new runs. Walk-through::

    treadle worker --handlers examples.expenses_before      # v1 as first deployed
    treadle runs start expense-report --input '{"employee": "ana", "amount_cents": 4200}'
    # … the run waits on "manager"; stop the worker, deploy the new code:
    treadle worker --handlers examples.expenses
    treadle runs start expense-report --input '{"employee": "bo", "amount_cents": 900}'
    treadle runs approve OLD_RUN manager    # → {"paid": …, "audit": null}
    treadle runs approve NEW_RUN manager    # → {"paid": …, "audit": "audited …"}

Once no run that predates the change is open (``GET /workflows`` shows open runs per
version; list them by status), replace the ``if`` with ``ctx.deprecate_patch(...)`` and
then, when the marked runs are gone too, drop the call.
"""

from __future__ import annotations

from app.sdk import WorkflowContext, workflow
from examples.expenses_before import Expense, pay, prepare

__all__ = ["Expense", "audit", "expense_report"]


def audit(claim: str) -> str:
    """Record the claim in the audit log (simulated)."""
    return f"audited {claim}"


@workflow("expense-report")
async def expense_report(ctx: WorkflowContext, expense: Expense) -> dict[str, str | None]:
    """Prepare, audit (runs started on this code), wait for a manager, pay."""
    claim = await ctx.step(prepare, expense.employee, expense.amount_cents)
    note = None
    if ctx.patched("audit-before-approval"):
        note = await ctx.step(audit, claim)
    await ctx.approval("manager")
    return {"paid": await ctx.step(pay, claim), "audit": note}
