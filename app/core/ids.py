"""Identifier types and generation.

Run ids are UUIDv7 (RFC 9562): time-ordered, so keyset pagination on the id follows
creation order and B-tree inserts stay append-mostly.
"""

from __future__ import annotations

import re
import uuid
from typing import NewType, TypeGuard

import uuid_utils.compat

RunId = NewType("RunId", uuid.UUID)
DeadLetterId = NewType("DeadLetterId", uuid.UUID)
TenantId = NewType("TenantId", str)
StepId = NewType("StepId", str)
WorkerId = NewType("WorkerId", str)

TENANT_ID_PATTERN = r"^[A-Za-z0-9_.\-]{1,128}$"
"""What a tenant id may be: 1..128 of letters, digits, ``_``, ``.``, ``-``.

The one rule for every place a tenant id enters: token claims (dev and jwt), API keys,
``?tenant=``, ``/admin/tenants/{tenant}``. It fits the ``String(128)`` tenant columns and
needs no escaping in URLs, logs or metrics.
"""
_TENANT_ID_RE = re.compile(TENANT_ID_PATTERN)


def is_tenant_id(value: object) -> TypeGuard[str]:
    """True if ``value`` is a well-formed tenant id (see :data:`TENANT_ID_PATTERN`)."""
    # fullmatch: ``$`` alone would accept a trailing newline.
    return isinstance(value, str) and _TENANT_ID_RE.fullmatch(value) is not None


def new_uuid7() -> uuid.UUID:
    """Return a new RFC 9562 version-7 UUID as a stdlib ``uuid.UUID``."""
    return uuid_utils.compat.uuid7()


def new_run_id() -> RunId:
    """Return a fresh UUIDv7 run id."""
    return RunId(new_uuid7())
