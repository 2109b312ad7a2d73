"""The console's page modules, in one list :func:`app.console.mount` includes under ``/ui``.

Add a page module's ``router`` here (see the :mod:`app.console` docstring).
"""

from __future__ import annotations

from fastapi import APIRouter

from app.console import (
    approvals_page,
    auth_pages,
    dead_letters_page,
    oidc_pages,
    run_page,
    runs_page,
    schedules_page,
    workflows_page,
)

ROUTERS: list[APIRouter] = [
    auth_pages.router,
    oidc_pages.router,
    runs_page.router,
    run_page.router,
    approvals_page.router,
    dead_letters_page.router,
    schedules_page.router,
    workflows_page.router,
]
