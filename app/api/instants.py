"""Request-body instants: a datetime the API accepts is one it can convert to UTC.

A timezone-aware datetime near the ends of the calendar (``0001-01-01T00:00:00+23:59``,
``9999-12-31T23:59:59-23:59``) parses, but has no UTC value: ``astimezone(UTC)`` raises
``OverflowError`` wherever the value is first converted (a schedule's ``at``, a bulk
filter's bound bound to SQL), which answered 500. Validating at the edge turns it into
``422 invalid_input`` naming the field, for every body field of this type; query
parameters get the same rule in ``app/api/routes/runs.py`` (``_utc``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator


def in_utc_range(value: datetime | None) -> datetime | None:
    """Return ``value`` unchanged if it converts to UTC (naive values pass through).

    Naive values are left to the field's own rule (``AwareDatetime`` refuses them; a
    schedule's ``at`` is refused by the engine with its own message).

    Raises:
        ValueError: the value falls outside years 1 to 9999 once converted to UTC.
    """
    if value is None or value.tzinfo is None:
        return value
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError("outside the dates that can be stored (years 1 to 9999 in UTC)") from None
    return value


Instant = Annotated[datetime, AfterValidator(in_utc_range)]
"""A body datetime that converts to UTC (see the module docstring)."""
