"""Opaque page tokens bound to the tenant and the filters they were issued for.

A token carries its keyset position and a SHA-256 check over (tenant, scope, filters,
position): a token replayed by another tenant, for another query, or altered in any byte
is refused with 400. It is not a secret-keyed signature: someone who knows the scheme
can forge a position for their *own* tenant and query, which only moves where their own
listing starts (every query is tenant-scoped), so positions are also range-checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from app.core import json
from app.core.errors import BadRequest


def _binding(tenant_id: str, scope: str, filters: dict[str, Any], position: Any) -> str:
    raw = json.dumps({"t": tenant_id, "s": scope, "f": filters, "p": position})
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def encode_token(tenant_id: str, scope: str, filters: dict[str, Any], position: Any) -> str:
    """Return a URL-safe token for the page after ``position``.

    Args:
        tenant_id: the caller's tenant (a token replayed by another tenant is refused).
        scope: what is paged (``"runs"``, ``"steps:<run_id>"``).
        filters: the query's filters (a token replayed with other filters is refused).
        position: JSON-able keyset position (last id served).
    """
    body = json.dumps({"b": _binding(tenant_id, scope, filters, position), "p": position})
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def decode_token(token: str, tenant_id: str, scope: str, filters: dict[str, Any]) -> Any:
    """Return the position encoded by :func:`encode_token`.

    Raises:
        BadRequest: malformed token, or issued for another tenant, scope or filters.
    """
    try:
        padded = token + "=" * (-len(token) % 4)
        body = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")).decode())
        binding, position = body["b"], body["p"]
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeError) as exc:
        raise BadRequest("page_token is malformed") from exc
    try:
        expected = _binding(tenant_id, scope, filters, position)
    except ValueError as exc:  # a position json.dumps refuses (e.g. a huge float)
        raise BadRequest("page_token is malformed") from exc
    if binding != expected:
        raise BadRequest("page_token was issued for a different query")
    return position


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def int_position(
    page_token: str | None,
    tenant_id: str,
    scope: str,
    filters: dict[str, Any] | None = None,
    maximum: int = INT64_MAX,
) -> int | None:
    """Decode a page token whose position is an integer keyset (a seq, an event id).

    Args:
        page_token: the token, or None / empty for the first page.
        tenant_id: the caller's tenant.
        scope: what is paged (``"steps:<run_id>"``).
        filters: the list's filters; a token only pages the list it was issued for.
        maximum: the keyset column's largest value (:data:`INT32_MAX` for an INTEGER
            column): a larger position would fail in the driver, not here.

    Returns:
        None for the first page.

    Raises:
        BadRequest: malformed, or issued for another tenant, scope or filters.
    """
    if not page_token:
        return None
    position = decode_token(page_token, tenant_id, scope, filters or {})
    if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position <= maximum:
        raise BadRequest("page_token is malformed")
    return position
