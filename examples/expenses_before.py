"""The ``expense-report`` workflow as first deployed (before the upgrade in ``expenses``).

prepare → manager approval → pay. Runs started on this code and waiting for their
approval keep working after the workers are redeployed with ``examples.expenses``, which
adds an audit step *before* the approval behind ``ctx.patched("audit-before-approval")``.
See ``examples/expenses.py`` for the walk-through.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.sdk import WorkflowContext, workflow


class Expense(BaseModel):
    """Input of ``expense-report``."""

    employee: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(gt=0, le=10_000_000)


def prepare(employee: str, amount_cents: int) -> str:
    """Validate and book the claim (simulated)."""
    return f"claim-{employee}-{amount_cents}"


def pay(claim: str) -> str:
    """Pay the claim (simulated)."""
    return f"paid {claim}"


@workflow("expense-report")
async def expense_report(ctx: WorkflowContext, expense: Expense) -> dict[str, str | None]:
    """Prepare, wait for a manager, pay."""
    claim = await ctx.step(prepare, expense.employee, expense.amount_cents)
    await ctx.approval("manager")
    return {"paid": await ctx.step(pay, claim), "audit": None}
