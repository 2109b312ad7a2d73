"""Webhook signatures (Standard Webhooks + ``Treadle-Signature``), the SSRF guard, the scope."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
from typing import get_args

import pytest

from app.api.schemas import CreateApiKeyRequest, ScopeName
from app.auth.principal import Scope
from app.core.errors import WebhookTargetRefused
from app.engine.addresses import refusal
from app.engine.webhooks import check_target, parse_url
from app.sdk.webhooks import WebhookVerificationError, new_secret, sign, verify_signature

BODY = b'{"type":"run.completed","data":{"run_id":"r"}}'
NOW = 1_800_000_000


def test_signature_verifies_and_follows_the_standard() -> None:
    secret = new_secret()
    assert secret.startswith("whsec_")
    headers = sign(secret, msg_id="d-1", timestamp=NOW, body=BODY)
    assert verify_signature(secret, headers, BODY, now=NOW + 10) == "d-1"
    # Recomputed by hand from the spec: HMAC-SHA256(base64-decoded key, "id.ts.body").
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = hmac.new(key, b"d-1.%d." % NOW + BODY, hashlib.sha256).digest()
    assert headers["webhook-signature"] == "v1," + base64.b64encode(expected).decode()
    stripe = hmac.new(key, b"%d." % NOW + BODY, hashlib.sha256).hexdigest()
    assert headers["Treadle-Signature"] == f"t={NOW},v1={stripe}"
    # Header names are case-insensitive; several signatures (rotation): one match suffices.
    upper = {k.upper(): v for k, v in headers.items()}
    upper["WEBHOOK-SIGNATURE"] = "v1,AAAA " + headers["webhook-signature"]
    assert verify_signature(secret, upper, BODY, now=NOW) == "d-1"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("body", "no signature matches"),
        ("secret", "no signature matches"),
        ("old", "from now"),
        ("future", "from now"),
        ("missing", "missing"),
        ("id", "no signature matches"),
        ("stamp", "Unix seconds"),
    ],
)
def test_tampered_or_old_deliveries_are_refused(change: str, message: str) -> None:
    secret = new_secret()
    headers = sign(secret, msg_id="d-1", timestamp=NOW, body=BODY)
    body, now, key = BODY, float(NOW), secret
    if change == "body":
        body = BODY.replace(b"r", b"s")
    elif change == "secret":
        key = new_secret()
    elif change == "old":
        now = NOW + 301.0
    elif change == "future":
        now = NOW - 301.0
    elif change == "missing":
        del headers["webhook-signature"]
    elif change == "id":
        headers["webhook-id"] = "d-2"
    elif change == "stamp":
        headers["webhook-timestamp"] = "soon"
    with pytest.raises(WebhookVerificationError, match=message):
        verify_signature(key, headers, body, now=now)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "fe80::1",
        "fc00::1",
        "ff02::1",
    ],
)
async def test_ssrf_guard_refuses_non_public_addresses(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is not None
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(WebhookTargetRefused, match="webhook targets must be public"):
        await check_target(f"http://{host}:8080/hook", allow_private=False)
    # The setting lets tests (and private deployments) reach them.
    target = await check_target(f"http://{host}:8080/hook", allow_private=True)
    assert target.address == ipaddress.ip_address(address)


async def test_ssrf_guard_resolves_host_names() -> None:
    with pytest.raises(WebhookTargetRefused, match="'localhost' resolves to loopback"):
        await check_target("https://localhost/hook", allow_private=False)
    assert refusal(ipaddress.ip_address("93.184.215.14")) is None
    assert refusal(ipaddress.ip_address("2606:4700::1111")) is None
    with pytest.raises(WebhookTargetRefused, match="does not resolve"):
        await check_target("https://no-such-host.invalid/hook", allow_private=True)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "scheme must be http or https"),
        ("file:///etc/passwd", "scheme must be http or https"),
        ("javascript:alert(1)", "scheme must be http or https"),
        ("example.com/hook", "scheme must be http or https"),
        ("http:///nohost", "no host"),
        ("http://exa mple.com/", "whitespace"),
        ("http://example.com/\x00", "control"),
        ("http://example.com/caf\u00e9", "non-ASCII"),
        ("http://user:pw@example.com/", "user info"),
        ("http://example.com:99999/", "malformed"),
        ("http://[::1/", "malformed"),
        ("https://example.com/" + "a" * 2048, "longer than 2048"),
    ],
)
def test_malformed_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(WebhookTargetRefused, match=message):
        parse_url(url)


def test_url_parts() -> None:
    assert parse_url("HTTPS://Example.com/x?y=1") == ("https", "example.com", 443)
    assert parse_url("http://example.com:8080") == ("http", "example.com", 8080)


def test_api_keys_may_carry_every_scope_including_webhooks_manage() -> None:
    assert set(get_args(ScopeName)) == {s.value for s in Scope}
    every = CreateApiKeyRequest(name="all", scopes=[s.value for s in Scope])
    assert "webhooks:manage" in every.scopes
