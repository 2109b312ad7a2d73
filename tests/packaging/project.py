"""A team's own handler repository, as the packaging tests write it outside the checkout.

Kept as strings so that this checkout's pytest and mypy never collect it as its own code:
it must import only the installed wheel. docs/your-project.md shows the same files.
"""

from __future__ import annotations

from pathlib import Path

PYPROJECT = """\
[project]
name = "theirpkg"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["treadle[postgres]"]

[tool.pytest.ini_options]
asyncio_mode = "auto"
asyncio_default_fixture_loop_scope = "function"
filterwarnings = ["error"]

[tool.mypy]
strict = true
plugins = ["pydantic.mypy"]
"""

MODELS = '''\
"""Invoices: the team's own pydantic models."""

from pydantic import BaseModel, Field


class InvoiceRequest(BaseModel):
    """Input of the ``invoice`` workflow."""

    customer: str = Field(min_length=1)
    amounts_cents: list[int]
    # How long to wait before sending (a grace period for corrections).
    grace_seconds: float = Field(default=0, ge=0)


class Invoice(BaseModel):
    """Output of the ``invoice`` workflow."""

    customer: str
    total_cents: int
    sent: bool
'''

FLOWS = '''\
"""The team's workflows: ``treadle worker --handlers theirpkg.flows``."""

from app.sdk import WorkflowContext, workflow

from theirpkg.models import Invoice, InvoiceRequest


def total(amounts_cents: list[int]) -> int:
    """Sum the invoice lines."""
    return sum(amounts_cents)


def send(customer: str, total_cents: int) -> bool:
    """Send the invoice (simulated)."""
    return total_cents >= 0 and bool(customer)


@workflow("invoice")
async def invoice(ctx: WorkflowContext, req: InvoiceRequest) -> Invoice:
    """Total the lines, wait out the grace period, send."""
    cents = await ctx.step(total, req.amounts_cents)
    if req.grace_seconds:
        await ctx.sleep(req.grace_seconds)
    sent = await ctx.step(send, req.customer, cents)
    return Invoice(customer=req.customer, total_cents=cents, sent=sent)
'''

UNIT_TEST = '''\
"""Unit test with Treadle's test kit: real engine, throwaway SQLite, virtual clock."""

from datetime import timedelta

from app.sdk.testing import RunStatus, WorkflowTestEnv

from theirpkg.flows import invoice
from theirpkg.models import InvoiceRequest

THREE_DAYS = timedelta(days=3).total_seconds()


async def test_invoice_is_sent_after_a_three_day_grace_period() -> None:
    req = InvoiceRequest(customer="acme", amounts_cents=[1200, 34], grace_seconds=THREE_DAYS)
    async with WorkflowTestEnv([invoice]) as env:
        run = await env.start(invoice, req)
        assert (await env.get(run)).status == RunStatus.WAITING_TIMER
        await env.skip(timedelta(days=3))
        result = await env.result(run)
    assert result.total_cents == 1234
    assert result.sent
'''

# A team whose own package is called ``app`` (docs/adr/0015-the-app-package-name.md).
APP_FLOWS = '''\
from app.sdk import WorkflowContext, workflow


@workflow("clash")
async def clash(ctx: WorkflowContext) -> None:
    """Never imported: this ``app`` is shadowed by Treadle's own."""
'''


def write_project(root: Path) -> Path:
    """Write the handler repository under ``root``; return ``root``."""
    files = {
        "pyproject.toml": PYPROJECT,
        "theirpkg/__init__.py": '"""The team\'s handlers."""\n',
        "theirpkg/py.typed": "",
        "theirpkg/models.py": MODELS,
        "theirpkg/flows.py": FLOWS,
        "tests/__init__.py": "",
        "tests/test_invoice.py": UNIT_TEST,
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
