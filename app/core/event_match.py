"""Declarative event matching: ``event_filter`` on a trigger, ``match`` on a wait.

Both are the same data, a JSON object ``{dotted path: expected value}``: an event's data
matches when, for every entry, following the path's dot-separated keys through nested
objects reaches a value equal to the expected one. ``{}`` matches any data. Stored with the
definition (``workflow_definitions.event_filter``) or the wait (``event_waits.match``) as
JSON, so the API evaluates a trigger's filter without importing handler code
(docs/adr/0029-event-triggers.md).

Equality is JSON equality, not Python's: ``true`` never equals ``1``, while ``1`` and
``1.0`` are one number, as in request fingerprints (docs/adr/0012).
"""

from __future__ import annotations

from typing import Any

from app.core import json

MAX_ENTRIES = 20
"""Entries in one filter or match: evaluated per candidate event, so kept small."""

MAX_PATH_LENGTH = 200
"""Characters in one dotted path."""

_MISSING = object()


class MatchError(ValueError):
    """A filter or match that is not ``{dotted path: JSON value}`` within the bounds."""


def check_match(label: str, match: object) -> dict[str, Any]:
    """Return ``match`` if it is a valid filter, with its values JSON-checked.

    Args:
        label: what is being checked, for the message (e.g. ``"event_filter"``).
        match: the candidate, usually a ``dict``; None is taken as ``{}``.

    Returns:
        The filter, as a new ``dict``.

    Raises:
        MatchError: not a mapping of 1..200-character dotted paths (no empty segment) to
            JSON-encodable values, or more than :data:`MAX_ENTRIES` entries.
    """
    if match is None:
        return {}
    if not isinstance(match, dict):
        raise MatchError(f"{label} must be an object of {{dotted path: value}}, not {match!r}")
    if len(match) > MAX_ENTRIES:
        raise MatchError(f"{label} has {len(match)} entries; at most {MAX_ENTRIES}")
    for path, expected in match.items():
        if not isinstance(path, str) or not 1 <= len(path) <= MAX_PATH_LENGTH:
            raise MatchError(f"{label}: path {path!r} must be a 1..{MAX_PATH_LENGTH}-char string")
        if "" in path.split("."):
            raise MatchError(f"{label}: path {path!r} has an empty segment")
        try:
            json.dumps(expected)
        except (TypeError, ValueError) as exc:
            raise MatchError(f"{label}: value at {path!r} is not JSON: {exc}") from None
    return dict(match)


def _lookup(data: Any, path: str) -> Any:
    node = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def matches(match: dict[str, Any], data: Any) -> bool:
    """Whether ``data`` (an event's JSON data) satisfies every entry of ``match``.

    A path through a non-object, or to a missing key, does not match (not even ``null``).
    """
    for path, expected in match.items():
        found = _lookup(data, path)
        if found is _MISSING:
            return False
        if json.canonical_dumps(found) != json.canonical_dumps(expected):
            return False
    return True
