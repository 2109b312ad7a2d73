"""Who is calling: tenant, subject, scopes (DESIGN §4)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


class Scope(StrEnum):
    """Permissions a token can carry."""

    RUNS_WRITE = "runs:write"
    RUNS_READ = "runs:read"
    RUNS_CANCEL = "runs:cancel"
    APPROVALS_WRITE = "approvals:write"
    SIGNALS_WRITE = "signals:write"
    EVENTS_WRITE = "events:write"
    # Register, list and delete webhook endpoints, read their delivery logs.
    WEBHOOKS_MANAGE = "webhooks:manage"
    ADMIN = "admin"


ALL_SCOPES = frozenset(Scope)


class RunAction(StrEnum):
    """What a caller does to a run that exists, single or in bulk.

    Single: ``POST /runs/{id}/<verb>`` (``…/signals/{name}``, ``…/approvals/{step_id}``,
    ``POST /dead-letters/{id}/requeue``); in bulk: ``POST /runs:<verb>``.
    """

    CANCEL = "cancel"
    SIGNAL = "signal"
    DECIDE_APPROVAL = "decide_approval"
    RESUME = "resume"
    RETRY = "retry"
    REQUEUE = "requeue"
    PAUSE = "pause"
    UNPAUSE = "unpause"
    RERUN = "rerun"


ACTION_SCOPES: Mapping[RunAction, Scope] = MappingProxyType(
    {
        RunAction.CANCEL: Scope.RUNS_CANCEL,
        RunAction.SIGNAL: Scope.SIGNALS_WRITE,
        RunAction.DECIDE_APPROVAL: Scope.APPROVALS_WRITE,
        RunAction.RESUME: Scope.RUNS_WRITE,
        RunAction.RETRY: Scope.RUNS_WRITE,
        RunAction.REQUEUE: Scope.RUNS_WRITE,
        RunAction.PAUSE: Scope.RUNS_WRITE,
        RunAction.UNPAUSE: Scope.RUNS_WRITE,
        RunAction.RERUN: Scope.RUNS_WRITE,
    }
)
"""The one rule of which scope each verb on a run needs (docs/security.md, "Scopes of
actions on runs"). The single-run routes (``app.api.deps.require_action``), the bulk
routes and the batch runner's per-item re-check (app/engine/batches.py) all read it, so a
bulk action can never need less than the single action it repeats."""

APPROVER_SCOPES = frozenset({Scope.RUNS_READ, Scope.APPROVALS_WRITE})
"""What a person who only decides approvals needs: see runs (the API and the console's
run and approval pages) and decide their approvals. The approver token ``treadle dev``
prints carries these and nothing more (least privilege: it cannot start, cancel or signal
runs, send events, manage webhooks or administer)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller.

    Attributes:
        tenant_id: every query the caller makes is scoped to this tenant.
        subject: who (``sub`` claim); recorded as the actor of submissions and cancels.
        scopes: granted scopes.
        groups: group claims (approvals may require one).
        api_key_id: the API key that authenticated the call (None for a JWT); recorded on
            submitted runs so each worker attempt can re-check it is not revoked.
    """

    tenant_id: str
    subject: str
    scopes: frozenset[Scope]
    groups: frozenset[str] = field(default_factory=frozenset)
    api_key_id: uuid.UUID | None = None

    def has(self, scope: Scope) -> bool:
        """True if the principal holds ``scope`` (``admin`` implies every scope)."""
        return scope in self.scopes or Scope.ADMIN in self.scopes

    @property
    def is_admin(self) -> bool:
        """True for operators (``admin`` scope): cross-tenant reads, any owner's runs."""
        return Scope.ADMIN in self.scopes

    @property
    def owner_filter(self) -> str | None:
        """The subject that owner-policy runs must match, or None (admin sees them all)."""
        return None if self.is_admin else self.subject
