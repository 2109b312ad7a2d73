"""Signing and verifying Treadle's outbound webhooks (for receivers: ``verify_signature``).

Treadle signs each delivery the Standard Webhooks way (https://www.standardwebhooks.com/,
docs/security.md "Outbound webhooks"):

- ``webhook-id``: the delivery id, the same on every attempt of one delivery (dedupe on it);
- ``webhook-timestamp``: Unix seconds when this attempt was signed;
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>``,
  where ``key`` is the base64-decoded part of the endpoint's ``whsec_…`` secret.

It also sends ``Treadle-Signature: t=<timestamp>,v1=<hex HMAC-SHA256(key,
"<timestamp>.<body>")>`` (the Stripe-style form) for receivers that verify that one. Both
use the same key. Only the standard library is used, so a receiver can copy this module.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_SECONDS = 300.0
"""How far a timestamp may be from the receiver's clock (5 minutes, as Standard Webhooks)."""


class WebhookVerificationError(Exception):
    """The delivery is not authentic: a header is missing, too old, or no signature matches."""


def new_secret() -> str:
    """A fresh endpoint secret: ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _key(secret: str) -> bytes:
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise WebhookVerificationError("the secret is not a whsec_<base64> secret") from None


def sign(secret: str, *, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The signature headers of one delivery attempt.

    Args:
        secret: the endpoint's ``whsec_…`` secret.
        msg_id: the delivery id (``webhook-id``).
        timestamp: Unix seconds (``webhook-timestamp``).
        body: the exact bytes sent.

    Returns:
        ``webhook-id``, ``webhook-timestamp``, ``webhook-signature`` and
        ``Treadle-Signature`` headers.
    """
    key = _key(secret)
    standard = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    stripe = hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(standard).decode(),
        "Treadle-Signature": f"t={timestamp},v1={stripe}",
    }


def verify_signature(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    *,
    now: float | None = None,
) -> str:
    """Check that ``body`` with ``headers`` was signed by Treadle with ``secret``.

    Verify the raw body as received, before parsing it: re-serialized JSON would differ.
    The Standard Webhooks headers are checked; ``webhook-signature`` may list several
    space-separated ``v1,…`` entries (secret rotation), one match suffices. Comparisons
    are constant-time.

    Args:
        secret: the endpoint's ``whsec_…`` secret (shown once by ``POST /webhooks``).
        headers: the request headers; names are matched case-insensitively.
        body: the raw request body.
        tolerance: seconds the timestamp may differ from ``now`` either way (replays of an
            old delivery are refused).
        now: Unix seconds (default: ``time.time()``).

    Returns:
        The delivery id (``webhook-id``): store it to drop a repeated delivery.

    Raises:
        WebhookVerificationError: a header is missing or malformed, the timestamp is
            outside ``tolerance``, or no signature matches.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get("webhook-id")
    stamp = lower.get("webhook-timestamp")
    signatures = lower.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        raise WebhookVerificationError("webhook-id, webhook-timestamp or webhook-signature missing")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not Unix seconds") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookVerificationError(
            f"webhook-timestamp is {current - timestamp:.0f} s from now (tolerance {tolerance} s)"
        )
    expected = sign(secret, msg_id=msg_id, timestamp=timestamp, body=body)["webhook-signature"]
    for candidate in signatures.split():
        if candidate.startswith("v1,") and hmac.compare_digest(candidate, expected):
            return msg_id
    raise WebhookVerificationError("no signature matches the body")


__all__ = [
    "DEFAULT_TOLERANCE_SECONDS",
    "WebhookVerificationError",
    "new_secret",
    "sign",
    "verify_signature",
]
