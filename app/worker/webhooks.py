"""A worker's webhook sender: claim due deliveries, POST them signed, write each outcome.

docs/adr/0030-outbound-webhooks.md. Every worker runs one :class:`WebhookSender` beside
its claim loop. A delivery is claimed for one attempt under a fence
(``app/db/queries/webhooks.py`` ``claim_due``); the POST happens outside any transaction;
the outcome is written under the fence. A failed POST (no answer, a non-2xx status, a
redirect: redirects are not followed) is retried with exponential backoff
(:class:`app.sdk.retry.RetryPolicy` from the ``TREADLE_WEBHOOK_*`` settings) until
``TREADLE_WEBHOOK_MAX_ATTEMPTS``, then the delivery is final ``failed``. A sender killed
mid-POST leaves the delivery due again once its claim lapses, for any worker: delivery is
at least once, with the same ``webhook-id`` on every attempt for the receiver to dedupe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import httpx
import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import metrics
from app.core.errors import WebhookTargetRefused
from app.core.settings import Settings
from app.db.database import Database, fetch_now
from app.db.queries import webhooks as webhooks_q
from app.engine import webhooks as engine
from app.sdk.retry import RetryPolicy
from app.sdk.webhooks import sign

log = structlog.get_logger("treadle.webhooks")


def retry_policy(settings: Settings) -> RetryPolicy:
    """The backoff between POSTs of one delivery (20% deterministic jitter per delivery)."""
    return RetryPolicy(
        max_attempts=settings.webhook_max_attempts,
        backoff="exponential",
        delay=settings.webhook_retry_delay_seconds,
        max_delay=settings.webhook_retry_max_delay_seconds,
        jitter=0.2,
    )


class WebhookSender:
    """Sends due webhook deliveries until stopped.

    Args:
        db: the database.
        settings: timeouts, attempts, backoff, concurrency, the SSRF guard's switch.
        worker_id: written as the claim's owner (shown nowhere but the row).
        transport: an httpx transport (tests); default: a real connection per POST.
    """

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        worker_id: str,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.worker_id = worker_id
        self.policy = retry_policy(settings)
        self._transport = transport
        self.log = log.bind(worker_id=worker_id)

    async def run(self, stopping: asyncio.Event) -> None:
        """Loop until ``stopping`` is set: send what is due, else poll."""
        timeout = httpx.Timeout(self.settings.webhook_timeout_seconds)
        async with httpx.AsyncClient(
            timeout=timeout, follow_redirects=False, transport=self._transport, trust_env=False
        ) as client:
            while not stopping.is_set():
                try:
                    if await self.run_once(client):
                        continue
                except Exception as exc:  # noqa: BLE001 - DB down: try again at the next poll
                    self.log.warning("webhook pass failed", error=str(exc)[:300])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.settings.poll_interval_seconds)

    async def run_once(self, client: httpx.AsyncClient) -> int:
        """Claim what is due (up to ``TREADLE_WEBHOOK_CONCURRENCY``) and send it all.

        Returns:
            How many deliveries were attempted (0: none was due).
        """
        async with self.db.read() as conn:
            if not await webhooks_q.any_due(conn, await fetch_now(conn, self.db.dialect)):
                return 0

        async def claim_tx(conn: AsyncConnection) -> list[webhooks_q.ClaimedDelivery]:
            now = await fetch_now(conn, self.db.dialect)
            # The claim outlives the POST's deadline by a lease TTL: only a sender that
            # stopped (killed, partitioned) leaves it for another worker.
            hold = self.settings.webhook_timeout_seconds + self.settings.lease_ttl_seconds
            return await webhooks_q.claim_due(
                conn,
                worker_id=self.worker_id,
                now=now,
                lease_until=now + timedelta(seconds=hold),
                limit=self.settings.webhook_concurrency,
            )

        claimed = await self.db.write_retrying(claim_tx, what="claim webhook deliveries")
        await asyncio.gather(*(self.deliver(client, c) for c in claimed))
        return len(claimed)

    async def deliver(self, client: httpx.AsyncClient, claimed: webhooks_q.ClaimedDelivery) -> None:
        """One attempt of one claimed delivery, its outcome written under the fence."""
        async with self.db.read() as conn:
            body = await engine.delivery_body(conn, claimed)
        http_status, error = await self._post(client, claimed, body)
        delivered = http_status is not None and 200 <= http_status < 300
        last = claimed.attempt >= self.policy.max_attempts
        state = (
            webhooks_q.DELIVERED if delivered else webhooks_q.FAILED if last else webhooks_q.PENDING
        )
        delay = (
            None
            if state != webhooks_q.PENDING
            else self.policy.delay_after(claimed.attempt, str(claimed.delivery_id))
        )

        async def outcome_tx(conn: AsyncConnection) -> bool:
            now = await fetch_now(conn, self.db.dialect)
            return await webhooks_q.finish_attempt(
                conn,
                claimed,
                now=now,
                http_status=http_status,
                error=error,
                state=state,
                next_attempt_at=None if delay is None else now + timedelta(seconds=delay),
            )

        written = await self.db.write_retrying(outcome_tx, what="webhook attempt outcome")
        metrics.WEBHOOK_ATTEMPTS.labels("delivered" if delivered else "failed").inc()
        if written and state != webhooks_q.PENDING:
            metrics.WEBHOOK_DELIVERIES.labels(state).inc()
        self.log.info(
            "webhook attempt",
            delivery_id=str(claimed.delivery_id),
            run_id=str(claimed.run_id),
            workflow=claimed.workflow,
            attempt=claimed.attempt,
            http_status=http_status,
            error=error,
            state=state if written else "claim lost",
            retry_in_seconds=delay,
        )

    async def _post(
        self, client: httpx.AsyncClient, claimed: webhooks_q.ClaimedDelivery, body: bytes
    ) -> tuple[int | None, str | None]:
        """POST ``body``; returns ``(HTTP status, error)``: one of them is set.

        The host is resolved and checked again (DNS can change since registration), and
        the connection goes to the checked address, the Host header and TLS server name
        staying the URL's: a second lookup by the HTTP client cannot be steered elsewhere.
        """
        try:
            target = await engine.check_target(
                claimed.url, allow_private=self.settings.webhook_allow_private
            )
        except WebhookTargetRefused as exc:
            return None, f"refused: {exc.detail}"[:500]
        parts = urlsplit(claimed.url)
        address = str(target.address)
        literal = f"[{address}]" if target.address.version == 6 else address
        default_port = 443 if target.scheme == "https" else 80
        netloc = literal if target.port == default_port else f"{literal}:{target.port}"
        pinned = urlunsplit((target.scheme, netloc, parts.path or "/", parts.query, ""))
        host_header = parts.netloc.rsplit("@", 1)[-1]
        headers = {
            "Host": host_header,
            "Content-Type": "application/json",
            "User-Agent": "Treadle-Webhooks/1",
            **sign(
                claimed.secret,
                msg_id=str(claimed.delivery_id),
                timestamp=int(time.time()),
                body=body,
            ),
        }
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        try:
            response = await client.post(
                pinned, content=body, headers=headers, extensions=extensions
            )
        except httpx.TimeoutException:
            return None, f"timed out after {self.settings.webhook_timeout_seconds} s"
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:500]
        if 300 <= response.status_code < 400:
            return response.status_code, "redirect not followed"
        return response.status_code, None
