r"""Payload encoding: JSON text, stored verbatim.

Payloads are kept as JSON *text* (not PostgreSQL ``jsonb``) so they round-trip exactly:
``jsonb`` rejects ``\\u0000`` and would normalise numbers and key order. ``ensure_ascii``
escapes NUL and non-BMP characters, so the text is safe in any TEXT column; Python's
``json`` keeps integers of any size (beyond 2^53). See docs/adr/0002-payload-encoding.md.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.errors import InvalidInput, PayloadTooLarge


def dumps(value: Any) -> str:
    """Encode a JSON-compatible value as compact ASCII JSON text.

    Raises:
        TypeError / ValueError: the value is not JSON-serialisable (NaN is refused).
    """
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def canonical_dumps(value: Any) -> str:
    """Encode a JSON value canonically: equal JSON values give equal text.

    For comparing requests, never for storing them (payloads are kept as given). Object
    keys are sorted (by code point, as RFC 8785 does); numbers take one form per value: an
    integral float is written as the integer it equals (``1``, ``1.0`` and ``1e0`` are all
    ``1``; ``-0.0`` is ``0``, as JSON's ``-0`` already parses to the integer 0), other
    floats in their shortest round-trip form, integers of any size exactly. Strings are
    compared exactly, code point for code point: Unicode normalization is not equality
    (``"é"`` precomposed and ``"é"`` decomposed are different requests). Booleans stay
    booleans (``true`` is not ``1``).

    Raises:
        TypeError / ValueError: as :func:`dumps` (not JSON-serialisable, NaN).
    """
    return json.dumps(
        _canonical(value),
        ensure_ascii=True,
        separators=(",", ":"),
        allow_nan=False,
        sort_keys=True,
    )


def _canonical_key(key: Any) -> Any:
    # JSON object keys are strings; json.dumps turns int/float/bool/None keys into their
    # JSON text, and so does this, so that sorting never compares a str with an int.
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(_canonical(key))
    return key  # not JSON: json.dumps raises TypeError for it


def _canonical(value: Any) -> Any:
    # Iterative (no recursion limit): payloads may nest up to MAX_DEPTH levels and the
    # caller may not have checked yet. Builds a copy with numbers in one form.
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return _canonical_float(value)
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        item, parent, slot = stack.pop()
        if isinstance(item, dict):
            built: Any = {}
            for key, child in item.items():
                built[_canonical_key(key)] = None
                stack.append((child, built, _canonical_key(key)))
        elif isinstance(item, list | tuple):
            built = [None] * len(item)
            stack.extend((child, built, i) for i, child in enumerate(item))
        elif isinstance(item, float) and not isinstance(item, bool):
            built = _canonical_float(item)
        else:
            built = item
        parent[slot] = built
    return root[0]


def _canonical_float(value: float) -> int | float:
    if value.is_integer():
        return int(value)  # also -0.0 -> 0
    return value  # NaN and Infinity stay, for dumps to refuse


def loads(text: str | None) -> Any:
    """Decode JSON text written by :func:`dumps`; ``None`` stays ``None``."""
    if text is None:
        return None
    return json.loads(text)


MAX_DEPTH = 200
"""Deepest nesting of arrays/objects accepted in a payload (pydantic's parser limit)."""


def _unicode_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_depth(value: Any, what: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse payloads nested too deep or holding strings that are not valid Unicode.

    Lone surrogates: JSON can spell them, but no typed model accepts them, so they would
    fail the run later; refusing them up front loses nothing. Iterative, so no recursion
    limit applies.

    Raises:
        InvalidInput: too deep, or a lone surrogate.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not _unicode_ok(item):
                raise InvalidInput(
                    f"{what} holds a string that is not valid Unicode (a lone surrogate)",
                    errors=[{"path": "$", "message": "lone surrogate in a string"}],
                )
            continue
        if isinstance(item, dict):
            stack.extend((key, depth) for key in item)
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise InvalidInput(
                    f"{what} is nested deeper than {max_depth} levels",
                    errors=[{"path": "$", "message": f"nesting over {max_depth} levels"}],
                )
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def dumps_limited(value: Any, limit: int, what: str) -> str:
    """Encode like :func:`dumps`, then enforce the payload byte ceiling.

    Args:
        value: JSON-compatible value.
        limit: maximum encoded size in bytes (``TREADLE_MAX_PAYLOAD_BYTES``).
        what: what the payload is ("input", "step output"), for the error message.

    Raises:
        PayloadTooLarge: the encoded value is longer than ``limit`` bytes.
        InvalidInput: nested deeper than :data:`MAX_DEPTH`, a lone surrogate, NaN or
            Infinity, or a value JSON cannot represent (a set, bytes, a tuple as a key).
    """
    check_depth(value, what)
    try:
        text = dumps(value)
    except ValueError as exc:  # NaN / Infinity: Python parses them, JSON does not have them
        raise InvalidInput(
            f"{what} contains NaN or Infinity, which JSON does not allow",
            errors=[{"path": "$", "message": str(exc)}],
        ) from exc
    except TypeError as exc:  # a set, bytes, an object, a tuple as a key: not JSON at all
        raise InvalidInput(
            f"{what} is not JSON-serialisable: {exc}",
            errors=[{"path": "$", "message": str(exc)}],
        ) from exc
    if len(text) > limit:
        raise PayloadTooLarge(
            f"{what} is {len(text)} bytes encoded; the limit is {limit} bytes",
            limit_bytes=limit,
            size_bytes=len(text),
        )
    return text
