"""Decoded API JSON with its timestamp members as datetimes (for the ``when`` macro).

Pages that call the API with ``api.request`` get plain JSON; the templates' ``when(dt)``
macro wants a :class:`datetime`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any


def with_times(value: Any, keys: Collection[str], *, keep: Collection[str] = ("input",)) -> Any:
    """``value`` with the ISO 8601 strings under the member names ``keys`` as datetimes.

    Walks nested lists and dicts, except under members named in ``keep`` (user JSON such as
    a schedule's input, left exactly as the API sent it). A string that does not parse is
    left as it is.
    """
    if isinstance(value, list):
        return [with_times(v, keys, keep=keep) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in keys and isinstance(item, str):
            try:
                out[key] = datetime.fromisoformat(item)
            except ValueError:
                out[key] = item
        elif key in keep:
            out[key] = item
        else:
            out[key] = with_times(item, keys, keep=keep)
    return out
