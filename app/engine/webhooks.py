"""Outbound webhooks: endpoints, the terminal-write hook, the SSRF guard, the body.

docs/adr/0030-outbound-webhooks.md. :func:`run_became_terminal` is the one hook every
path that makes a run terminal calls in its own transaction (the worker's outcome write,
a cancel; PostgreSQL's single-statement completion does the same insert in its statement),
so a terminal state is never committed without its deliveries. Workers send them
(``app/worker/webhooks.py``).

The SSRF guard (:func:`check_target`) refuses URLs that are not http(s), and hosts that
resolve to any address that is not globally routable (:func:`app.engine.addresses.refusal`:
private, loopback, link-local, site-local, multicast, reserved, unspecified, shared, and
IPv6 forms carrying such an IPv4 address), unless ``TREADLE_WEBHOOK_ALLOW_PRIVATE``.
It runs at registration and again before every send (DNS can change); the sender then
connects to the checked address itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.errors import InvalidInput, WebhookTargetRefused
from app.core.settings import Settings
from app.core.status import TERMINAL_RUN_STATUSES, RunStatus
from app.db.database import Database
from app.db.queries import run_labels as labels_q
from app.db.queries import webhooks as webhooks_q
from app.engine.addresses import IpAddress, refusal
from app.sdk.webhooks import new_secret

MAX_URL_LENGTH = 2048
MAX_ENDPOINTS_PER_TENANT = 50
EVENTS = tuple(s.value for s in RunStatus if s in TERMINAL_RUN_STATUSES)
"""The statuses an endpoint can subscribe to: the terminal run statuses."""


def _refuse(message: str) -> WebhookTargetRefused:
    return WebhookTargetRefused(message, errors=[{"path": "url", "message": message}])


@dataclass(frozen=True, slots=True)
class Target:
    """A checked webhook URL: its parts and the address to connect to."""

    scheme: str
    host: str
    port: int
    address: IpAddress


def parse_url(url: str) -> tuple[str, str, int]:
    """Check a webhook URL's form; returns ``(scheme, host, port)``.

    Raises:
        WebhookTargetRefused: longer than 2048 characters, control characters or
            whitespace, not ``http``/``https``, no host, user info, or a bad port.
    """
    if len(url) > MAX_URL_LENGTH:
        raise _refuse(f"url is longer than {MAX_URL_LENGTH} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url) or not url.isascii():
        raise _refuse("url contains whitespace, control or non-ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _refuse(f"url is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _refuse("url scheme must be http or https")
    if not parts.hostname:
        raise _refuse("url has no host")
    if parts.username is not None or parts.password is not None:
        raise _refuse("url must not carry user info (user:password@)")
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80)


async def check_target(url: str, *, allow_private: bool) -> Target:
    """Parse ``url``, resolve its host and apply the SSRF guard.

    Every address the host resolves to must pass (a name with one public and one private
    address is refused: the connection could go to either).

    Returns:
        The target with the first resolved address (the sender connects to it).

    Raises:
        WebhookTargetRefused: see :func:`parse_url`; the host does not resolve; or it
            resolves to a refused address and ``allow_private`` is false.
    """
    scheme, host, port = parse_url(url)
    try:
        literal: IpAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except (OSError, UnicodeError) as exc:
            raise _refuse(f"url host {host!r} does not resolve ({exc})") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        if not addresses:
            raise _refuse(f"url host {host!r} does not resolve")
    if not allow_private:
        for address in addresses:
            why = refusal(address)
            if why is not None:
                raise _refuse(
                    f"url host {host!r} resolves to {why}; webhook targets must be public "
                    "(TREADLE_WEBHOOK_ALLOW_PRIVATE=true allows private targets)"
                )
    return Target(scheme=scheme, host=host, port=port, address=addresses[0])


def check_events(events: Sequence[str] | None) -> list[str]:
    """The statuses an endpoint subscribes to (None: every terminal status).

    Raises:
        InvalidInput: an entry is not a terminal run status, or the list is empty.
    """
    if events is None:
        return list(EVENTS)
    unknown = [e for e in events if e not in EVENTS]
    if unknown or not events:
        message = f"events must be terminal run statuses ({', '.join(EVENTS)})"
        raise InvalidInput(message, errors=[{"path": "events", "message": message}])
    return [e for e in EVENTS if e in events]


async def create_endpoint(
    db: Database,
    settings: Settings,
    *,
    tenant_id: str,
    subject: str,
    url: str,
    events: Sequence[str] | None,
    workflow: str | None,
) -> RowMapping:
    """Register a webhook endpoint with a new signing secret (the row holds it).

    Raises:
        WebhookTargetRefused: the URL fails :func:`check_target` (422).
        InvalidInput: bad ``events`` (422), or the tenant has 50 endpoints already.
    """
    chosen = check_events(events)
    await check_target(url, allow_private=settings.webhook_allow_private)
    async with db.write() as conn:
        if await webhooks_q.count_endpoints(conn, tenant_id) >= MAX_ENDPOINTS_PER_TENANT:
            message = f"a tenant has at most {MAX_ENDPOINTS_PER_TENANT} webhook endpoints"
            raise InvalidInput(message, errors=[{"path": "", "message": message}])
        return await webhooks_q.insert_endpoint(
            conn,
            tenant_id=tenant_id,
            url=url,
            events=chosen,
            workflow=workflow,
            secret=new_secret(),
            created_by=subject,
        )


async def run_became_terminal(conn: AsyncConnection, run_id: uuid.UUID, *, tenant_id: str) -> int:
    """The terminal-write hook: write the run's deliveries in the caller's transaction.

    Call it on every path that makes a run terminal, after the terminal write. Each
    terminal write is one terminal state: a run made terminal again later (a dead letter
    requeued and finished anew) gets new deliveries with new ids.

    Returns:
        How many deliveries were written.
    """
    return await webhooks_q.record_terminal(conn, run_id, tenant_id=tenant_id)


async def delivery_body(conn: AsyncConnection, claimed: webhooks_q.ClaimedDelivery) -> bytes:
    """The JSON body of a delivery (Standard Webhooks envelope ``{type, timestamp, data}``).

    ``data`` is the run's summary: id, workflow, version, terminal status and reason,
    created/finished times, labels. Never the run's input, output or error: those are
    the tenant's data and may be personal; a receiver that needs them reads
    ``GET /runs/{id}`` with its own credentials.
    """
    run = await webhooks_q.run_for_payload(conn, claimed.run_id)
    data: dict[str, Any] = {
        "run_id": str(claimed.run_id),
        "workflow": claimed.workflow,
        "version": None if run is None else run["version"],
        "status": claimed.run_status,
        "reason": claimed.run_reason,
        "created_at": None if run is None else run["created_at"].isoformat(),
        "finished_at": claimed.finished_at.isoformat(),
        "labels": {} if run is None else labels_q.decode(run["labels"]),
    }
    envelope = {
        "type": f"run.{claimed.run_status}",
        "timestamp": claimed.finished_at.isoformat(),
        "delivery_id": str(claimed.delivery_id),
        "data": data,
    }
    return json.dumps(envelope).encode()
