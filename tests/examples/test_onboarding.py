"""Unit tests of examples/onboarding.py with the test kit (app.sdk.testing).

A template for handler authors: each test runs the real engine in-process on a
throwaway SQLite database, and days of waiting for a manager take milliseconds.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.core.errors import Forbidden
from app.sdk.testing import RunNotCompleted, RunStatus, StepStatus, WorkflowTestEnv
from examples.onboarding import ACCOUNTS, NOTIFICATIONS, Applicant, onboard

DOCS = {"files": ["passport.pdf"], "tax_id": "DE123"}


def applicant(customer_id: str, **extra: object) -> Applicant:
    return Applicant.model_validate(
        {"customer_id": customer_id, "company": "Acme", "email": "ops@acme.com", **extra}
    )


async def test_manager_approves_on_day_two_and_documents_follow() -> None:
    async with WorkflowTestEnv([onboard]) as env:
        run = await env.start(onboard, applicant("c-1", approval_timeout_seconds=3 * 86_400))
        assert (await env.get(run)).status == RunStatus.WAITING_APPROVAL

        await env.skip(timedelta(days=2))  # the manager is on holiday
        assert (await env.get(run)).status == RunStatus.WAITING_APPROVAL

        await env.approve(run, "manager", approver="maria", groups=["sales-manager"])
        assert (await env.get(run)).status == RunStatus.WAITING_SIGNAL

        await env.signal(run, "docs_uploaded", DOCS)
        result = await env.result(run)

    assert result is not None
    assert result.approved_by == ["maria"]
    assert result.billing_profile == f"bill_{result.account_id}_DE123"
    assert ACCOUNTS[result.account_id]["customer_id"] == "c-1"


async def test_only_sales_managers_may_approve() -> None:
    async with WorkflowTestEnv([onboard]) as env:
        run = await env.start(onboard, applicant("c-2"))
        with pytest.raises(Forbidden):
            await env.approve(run, "manager", approver="intern", groups=["sales"])
        assert (await env.step(run, "manager")).status == StepStatus.WAITING


async def test_rejection_notifies_sales_and_returns_none() -> None:
    async with WorkflowTestEnv([onboard]) as env:
        run = await env.start(onboard, applicant("c-3"))
        await env.reject(
            run, "manager", approver="maria", groups=["sales-manager"], comment="no budget"
        )
        assert await env.result(run) is None
        assert (await env.step(run, "manager.on_reject")).status == StepStatus.SUCCEEDED
    assert "rejected by maria: no budget" in NOTIFICATIONS


async def test_unanswered_approval_times_out_after_one_day() -> None:
    async with WorkflowTestEnv([onboard]) as env:
        run = await env.start(onboard, applicant("c-4"))  # default timeout: 86,400 s
        # The CRM check may need a retry (0.5 s back-off) before the approval starts.
        await env.advance_until(run, RunStatus.WAITING_APPROVAL)
        await env.skip(timedelta(hours=23))
        assert (await env.get(run)).status == RunStatus.WAITING_APPROVAL
        await env.skip(timedelta(hours=2))
        snapshot = await env.get(run)
        assert (snapshot.status, snapshot.reason) == (RunStatus.FAILED, "failure_timed_out")
        assert (await env.step(run, "manager")).status == StepStatus.TIMED_OUT


async def test_billing_failure_deletes_the_account_again() -> None:
    async with WorkflowTestEnv([onboard]) as env:
        run = await env.start(onboard, applicant("c-5"))
        await env.advance_until(run, RunStatus.WAITING_APPROVAL)
        await env.approve(run, "manager", approver="maria", groups=["sales-manager"])
        await env.signal(run, "docs_uploaded", {"files": ["passport.pdf"], "tax_id": " "})
        with pytest.raises(RunNotCompleted) as ended:
            await env.result(run)
        assert ended.value.snapshot.status == RunStatus.COMPENSATED
        account = await env.step(run, "create_account")
        assert account.status == StepStatus.COMPENSATED
    assert account.output not in ACCOUNTS


async def test_cancel_while_waiting_for_documents_deletes_nothing_it_did_not_create() -> None:
    async with WorkflowTestEnv([onboard]) as env:
        run = await env.start(onboard, applicant("c-6"))
        await env.approve(run, "manager", approver="maria", groups=["sales-manager"])
        snapshot = await env.cancel(run, reason="duplicate application")
        assert (snapshot.status, snapshot.reason) == (RunStatus.CANCELLED, "canceled_by_request")
        assert [s.step_id for s in await env.steps(run)] == [
            "validate_applicant",
            "manager",
            "signal:docs_uploaded",
        ]
