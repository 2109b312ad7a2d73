"""Customer onboarding, the reference scenario for waits and compensation.

validate → manager approval → documents signal → create account → set up billing (the
account is deleted again if billing fails) → account id.

Run it with ``treadle dev`` (loaded by default) or ``treadle worker --handlers
examples.onboarding``. Approve with ``treadle runs approve RUN_ID manager`` using a token
whose ``groups`` include ``sales-manager`` and whose subject did not submit the run, and
send the documents with ``treadle runs signal RUN_ID docs_uploaded --payload '{…}'``.

The "services" (CRM checks, account store, billing) are simulated in this module:
deterministic, in-process, no network.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

from app.sdk import (
    ApprovalDecision,
    Permanent,
    RetryPolicy,
    WorkflowContext,
    current_step,
    workflow,
)

BLOCKED_DOMAINS = {"example.invalid", "mailinator.com"}
PLANS = {"starter", "growth", "enterprise"}

# The simulated account store of this worker process (a real one would be a database or
# an HTTP API keyed by the step's idempotency key).
ACCOUNTS: dict[str, dict[str, str]] = {}
NOTIFICATIONS: list[str] = []


class Applicant(BaseModel):
    """Input of the ``onboarding`` workflow."""

    customer_id: str = Field(min_length=1, max_length=64)
    company: str = Field(min_length=1, max_length=200)
    email: str = Field(min_length=3, max_length=254)
    plan: str = "starter"
    approval_timeout_seconds: float = Field(default=86_400, gt=0, le=30 * 86_400)
    docs_timeout_seconds: float = Field(default=3 * 86_400, gt=0, le=30 * 86_400)


class Documents(BaseModel):
    """Payload of the ``docs_uploaded`` signal."""

    files: list[str] = Field(min_length=1)
    tax_id: str = ""


class Onboarded(BaseModel):
    """Output of the ``onboarding`` workflow."""

    account_id: str
    approved_by: list[str]
    billing_profile: str


class CrmUnavailable(Exception):
    """The CRM lookup failed transiently."""


def validate_applicant(applicant: Applicant) -> str:
    """Check the applicant against the CRM (the first attempt of some lookups fails)."""
    step = current_step()
    domain = applicant.email.rsplit("@", 1)[-1].lower()
    if domain in BLOCKED_DOMAINS or "@" not in applicant.email:
        raise Permanent(ValueError(f"e-mail domain {domain!r} is not accepted"))
    if applicant.plan not in PLANS:
        raise Permanent(ValueError(f"unknown plan {applicant.plan!r}"))
    digest = hashlib.sha256(applicant.customer_id.encode()).digest()
    if digest[0] % 3 == 0 and step.attempt == 1:
        raise CrmUnavailable("CRM timed out")
    return applicant.plan


def notify_rejection(decision: ApprovalDecision) -> str:
    """Tell sales the application was rejected (runs as a step on rejection)."""
    message = f"rejected by {', '.join(decision.decided_by)}: {decision.comment or '-'}"
    NOTIFICATIONS.append(message)
    return message


def create_account(applicant: Applicant) -> str:
    """Create the customer's account once per idempotency key."""
    key = current_step().idempotency_key
    account_id = "acct_" + hashlib.sha256(key.encode()).hexdigest()[:12]
    ACCOUNTS[account_id] = {"customer_id": applicant.customer_id, "plan": applicant.plan}
    return account_id


def delete_account(account_id: str) -> None:
    """Compensation of :func:`create_account`."""
    ACCOUNTS.pop(account_id, None)


def setup_billing(account_id: str, docs: Documents) -> str:
    """Create the billing profile; a missing tax id cannot be fixed by retrying."""
    if not docs.tax_id.strip():
        raise Permanent(ValueError("documents carry no tax id: billing cannot be set up"))
    return f"bill_{account_id}_{docs.tax_id}"


@workflow("onboarding", version=1)
async def onboard(ctx: WorkflowContext, applicant: Applicant) -> Onboarded | None:
    """Onboard one customer; ``None`` when sales rejected the application."""
    await ctx.step(
        validate_applicant,
        applicant,
        retry=RetryPolicy(max_attempts=3, backoff="exponential", delay=0.5, jitter=0.2),
        timeout=10,
    )
    decision = await ctx.approval(
        "manager",
        group="sales-manager",
        payload={"company": applicant.company, "plan": applicant.plan},
        timeout=applicant.approval_timeout_seconds,
        on_reject=notify_rejection,
    )
    if not decision.approved:
        return None
    docs = Documents.model_validate(
        await ctx.signal("docs_uploaded", timeout=applicant.docs_timeout_seconds)
    )
    account_id = await ctx.step(create_account, applicant, compensate=delete_account)
    billing = await ctx.step(setup_billing, account_id, docs)
    return Onboarded(
        account_id=account_id, approved_by=decision.decided_by, billing_profile=billing
    )
