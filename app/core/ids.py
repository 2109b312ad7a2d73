"""Identifier types and generation.

Run ids are UUIDv7 (RFC 9562): time-ordered, so keyset pagination on the id follows
creation order and B-tree inserts stay append-mostly.
"""

from __future__ import annotations

import uuid
from typing import NewType

import uuid_utils.compat

RunId = NewType("RunId", uuid.UUID)
DeadLetterId = NewType("DeadLetterId", uuid.UUID)
TenantId = NewType("TenantId", str)
StepId = NewType("StepId", str)
WorkerId = NewType("WorkerId", str)


def new_uuid7() -> uuid.UUID:
    """Return a new RFC 9562 version-7 UUID as a stdlib ``uuid.UUID``."""
    return uuid_utils.compat.uuid7()


def new_run_id() -> RunId:
    """Return a fresh UUIDv7 run id."""
    return RunId(new_uuid7())
