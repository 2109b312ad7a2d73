"""``treadle tenants …``: suspend and resume tenants, straight on the database.

Like ``treadle api-keys`` and ``treadle migrate``, these talk to the database directly
(``TREADLE_DATABASE_URL``), so an operator can act even when no admin token is at hand.
API processes notice a change within ``TREADLE_TENANT_CACHE_SECONDS``; workers at the
next attempt of each run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

import typer

from app.core.text import printable

if TYPE_CHECKING:
    from app.engine.tenants import TenantService, TenantState

tenants_app = typer.Typer(
    help="Suspend and resume tenants, straight on the database (like `treadle migrate`).",
    no_args_is_help=True,
)


def _tenants_run(work: Callable[[TenantService], Awaitable[None]]) -> None:
    """Run ``work`` on a :class:`TenantService` over the database (schema at head)."""
    # Imported here: app.cli.main imports this module to register the command group.
    from app.cli.main import run_on_database
    from app.engine.tenants import TenantService

    run_on_database(TenantService, work)


def _line(state: TenantState) -> str:
    changed = (
        f"by {state.changed_by} at {state.changed_at.isoformat()}"
        if state.changed_at is not None
        else "never changed"
    )
    reason = f"  reason: {state.reason}" if state.reason else ""
    # The reason is any text an operator typed: escaped, so it cannot forge a line.
    return printable(f"{state.tenant_id}  {state.status}  {changed}{reason}")


@tenants_app.command("list")
def tenants_list(
    suspended: Annotated[
        bool, typer.Option("--suspended", help="Only tenants suspended now")
    ] = False,
) -> None:
    """List tenants an operator has acted on (a tenant not listed is active)."""

    async def work(service: TenantService) -> None:
        after: str | None = None
        shown = 0
        while True:
            page = await service.list_tenants(
                status="suspended" if suspended else None, after=after, limit=500
            )
            for state in page:
                typer.echo(_line(state))
            shown += len(page)
            if len(page) < 500:
                break
            after = page[-1].tenant_id
        if not shown:
            typer.echo("(no tenants suspended)" if suspended else "(no tenants)")

    _tenants_run(work)


@tenants_app.command("suspend")
def tenants_suspend(
    tenant: str,
    reason: Annotated[str, typer.Option(help="Why (operators only; never shown to the tenant)")],
) -> None:
    """Suspend a tenant: its requests get 403 and its runs fail at their next attempt."""
    from app.cli.main import _operator

    async def work(service: TenantService) -> None:
        typer.echo(_line(await service.suspend(tenant_id=tenant, reason=reason, actor=_operator())))

    _tenants_run(work)


@tenants_app.command("resume")
def tenants_resume(tenant: str) -> None:
    """Resume a tenant; requeue the dead letters of runs that failed meanwhile to run them."""
    from app.cli.main import _operator

    async def work(service: TenantService) -> None:
        typer.echo(_line(await service.resume(tenant_id=tenant, actor=_operator())))

    _tenants_run(work)
