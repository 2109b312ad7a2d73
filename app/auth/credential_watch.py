"""Re-checking the credential of a response that stays open (an event stream, a long-poll).

A request is authenticated once, when it arrives; a short one ends long before its
credential could change. A long-lived response (``GET /runs/{id}/events?follow=true``,
``GET /runs/{id}/result?wait=S``) would otherwise keep serving a caller whose every other
request is refused. The rule of each worker attempt (DESIGN §4: re-check that the
principal may still act) therefore applies to such a response too
(docs/adr/0051-long-lived-responses-recheck-their-credential.md):

- **At the token's expiry**, exactly: a token with an ``exp`` lapses at ``exp`` plus the
  mode's leeway (:attr:`Authenticator.leeway_seconds`), the instant any new request with
  it is refused. That is known locally: no verifier call decides it.
- **On revocation or suspension, within a bounded delay**: every
  ``TREADLE_AUTH_RECHECK_SECONDS`` the token goes through the same
  :meth:`Authenticator.authenticate_verified` as a new request (its cache, TTL and tenant
  window included), and at once when this process revoked a key or suspended or resumed
  a tenant (:attr:`Authenticator.generation` moved). So an API key revoked or a tenant
  suspended through this process is noticed at the response's next poll; through another
  process or the CLI, within the interval plus ``TREADLE_AUTH_CACHE_TTL_SECONDS`` (a key)
  or ``TREADLE_TENANT_CACHE_SECONDS`` (a tenant), the windows a new request has too.

A check the identity provider cannot answer (its keys cannot be loaded: 503 for a new
request) does not end the response: the token may well be valid, the expiry timer still
holds, and the next interval checks again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from app.auth.authenticator import INVALID_TOKEN, Authenticator
from app.auth.token_cache import Verified
from app.core.errors import IdentityProviderUnavailable, TenantSuspended, Unauthenticated
from app.core.status import StreamEnd

log = structlog.get_logger("treadle.auth")


@dataclass(frozen=True, slots=True)
class Lapse:
    """Why a held credential is no longer accepted.

    Attributes:
        cause: ``credential_expired``, ``credential_revoked`` or ``tenant_suspended``.
        error: what a new request with the credential gets now (401 ``Unauthenticated``
            with the one refusal detail, or 403 ``TenantSuspended``): a response that has
            sent nothing yet (a long-poll) answers with it.
    """

    cause: StreamEnd
    error: Unauthenticated | TenantSuspended


class CredentialWatch:
    """The credential one long-lived response was authenticated with, re-checked while open.

    Holds the bearer token for the life of the response (the request held it anyway);
    never logs or exposes it.

    Args:
        authenticator: the process's authenticator (the path every request takes).
        token: the bearer token the request presented.
        verified: its verification when the request arrived.
        recheck_seconds: ``TREADLE_AUTH_RECHECK_SECONDS``: most seconds between two
            re-authentications.
        generation: :attr:`Authenticator.generation` as read before ``verified`` was
            made (default: now), so a change made while the request was authenticated
            is re-checked at once.
        clock: a monotonic clock in seconds (tests may pass their own).
        wall: the wall clock ``exp`` is compared with, Unix seconds.
    """

    def __init__(
        self,
        authenticator: Authenticator,
        token: str,
        verified: Verified,
        *,
        recheck_seconds: float,
        generation: tuple[int, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._authenticator = authenticator
        self._token = token
        self._recheck = recheck_seconds
        self._clock = clock
        self._wall = wall
        self._lapse: Lapse | None = None
        self._verified = verified
        self._due = self._next_due()
        self._generation = authenticator.generation if generation is None else generation

    def seconds_left(self) -> float:
        """Seconds until the next check is due (0 when due now); never negative."""
        return max(self._due - self._clock(), 0.0)

    async def lapsed(self) -> Lapse | None:
        """Check the credential if a check is due; the lapse once it is no longer accepted.

        Due at the token's expiry, one interval after the last check, or once this
        process revoked a key or suspended or resumed a tenant. Cheap between checks (a
        clock read and a counter compare). Once lapsed, it stays lapsed and is never
        checked again (no further verifier or database call).

        Raises:
            Exception: whatever a check's reads raise other than a refusal or an
                unavailable identity provider (a database error), as for a new request.
        """
        if self._lapse is not None:
            return self._lapse
        if self._clock() < self._due and self._authenticator.generation == self._generation:
            return None
        if self._expired():
            self._lapse = Lapse(StreamEnd.CREDENTIAL_EXPIRED, Unauthenticated(INVALID_TOKEN))
            return self._lapse
        # Read before the check: a change committed while it runs is seen by the next one.
        self._generation = self._authenticator.generation
        try:
            self._verified = await self._authenticator.authenticate_verified(self._token)
        except Unauthenticated as exc:
            # Valid when the response opened, refused before its expiry: revoked (an API
            # key revoked, a JWT whose signing key the provider withdrew).
            cause = (
                StreamEnd.CREDENTIAL_EXPIRED if self._expired() else StreamEnd.CREDENTIAL_REVOKED
            )
            self._lapse = Lapse(cause, exc)
        except TenantSuspended as exc:
            self._lapse = Lapse(StreamEnd.TENANT_SUSPENDED, exc)
        except IdentityProviderUnavailable as exc:
            log.warning("credential re-check deferred", reason=exc.detail)
        self._due = self._next_due()
        return self._lapse

    async def ensure_accepted(self) -> None:
        """Return while the credential is accepted (checking it if due).

        Raises:
            Unauthenticated: it expired or was revoked (401).
            TenantSuspended: its tenant was suspended (403).
        """
        lapse = await self.lapsed()
        if lapse is not None:
            raise lapse.error

    def _lapses_at(self) -> float | None:
        exp = self._verified.expires_at
        return None if exp is None else exp + self._authenticator.leeway_seconds

    def _expired(self) -> bool:
        at = self._lapses_at()
        return at is not None and self._wall() >= at

    def _next_due(self) -> float:
        now = self._clock()
        due = now + self._recheck
        at = self._lapses_at()
        if at is not None:
            # The expiry timer: the wall-clock instant as seconds from now on the monotonic
            # clock, measured again after every check (a wall-clock step moves it).
            due = min(due, now + max(at - self._wall(), 0.0))
        return due
