r"""Payload encoding: JSON text, stored verbatim.

Payloads are kept as JSON *text* (not PostgreSQL ``jsonb``) so they round-trip exactly:
``jsonb`` rejects ``\\u0000`` and would normalise numbers and key order. ``ensure_ascii``
escapes NUL and non-BMP characters, so the text is safe in any TEXT column; Python's
``json`` keeps integers of any size (beyond 2^53). See docs/adr/0002-payload-encoding.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from typing import Any, NamedTuple

from app.core.errors import InvalidInput, PayloadTooLarge


def dumps(value: Any) -> str:
    """Encode a JSON-compatible value as compact ASCII JSON text.

    Raises:
        TypeError / ValueError: the value is not JSON-serialisable (NaN is refused).
    """
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def canonical_dumps(value: Any, *, plain_members: Collection[str] = ()) -> str:
    """Encode a JSON value canonically: equal JSON values give equal text.

    For comparing requests, never for storing them (payloads are kept as given). Object
    keys are sorted (by code point, as RFC 8785 does); numbers take one form per value: an
    integral float is written as the integer it equals (``1``, ``1.0`` and ``1e0`` are all
    ``1``; ``-0.0`` is ``0``, as JSON's ``-0`` already parses to the integer 0), other
    floats in their shortest round-trip form, integers of any size exactly. Strings are
    compared exactly, code point for code point: Unicode normalization is not equality
    (``"é"`` precomposed and ``"é"`` decomposed are different requests). Booleans stay
    booleans (``true`` is not ``1``).

    ``plain_members`` names members of ``value`` (an object) that :func:`check_depth`
    found plain (no float, no non-string key): they are already in canonical form but
    for key order, which the encoder sorts, so they are not copied. The text is the same
    as without them; it saves a walk of a large payload (a batch's run inputs).

    Raises:
        TypeError / ValueError: as :func:`dumps` (not JSON-serialisable, NaN).
    """
    if plain_members and isinstance(value, dict):
        canonical: Any = {
            _canonical_key(key): child if key in plain_members else _canonical(child)
            for key, child in value.items()
        }
    else:
        canonical = _canonical(value)
    return json.dumps(
        canonical,
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


def check_depth(value: Any, what: str, max_depth: int = MAX_DEPTH) -> bool:
    """Refuse payloads nested too deep or holding strings that are not valid Unicode.

    Lone surrogates: JSON can spell them, but no typed model accepts them, so they would
    fail the run later; refusing them up front loses nothing. Iterative, so no recursion
    limit applies.

    Returns:
        Whether the value is plain: it holds no float and no object key that is not a
        string, so :func:`canonical_dumps` need not copy it (``plain_members``).

    Raises:
        InvalidInput: too deep, or a lone surrogate.
    """
    plain = True
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float):
            plain = False
            continue
        if isinstance(item, str):
            if not _unicode_ok(item):
                raise InvalidInput(
                    f"{what} holds a string that is not valid Unicode (a lone surrogate)",
                    errors=[{"path": "$", "message": "lone surrogate in a string"}],
                )
            continue
        if isinstance(item, dict):
            stack.extend((key, depth) for key in item)
            if plain and not all(isinstance(key, str) for key in item):
                plain = False
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise InvalidInput(
                    f"{what} is nested deeper than {max_depth} levels",
                    errors=[{"path": "$", "message": f"nesting over {max_depth} levels"}],
                )
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif item is not None and not isinstance(item, int):  # bool is an int
            # A tuple or a value JSON cannot hold: left to canonical_dumps to copy or refuse.
            plain = False
    return plain


class Encoded(NamedTuple):
    """A payload encoded by :func:`encode_limited`."""

    text: str
    """The JSON text, as :func:`dumps` writes it (what is stored)."""
    plain: bool
    """:func:`check_depth`'s verdict: no float, no non-string key."""


def dumps_limited(value: Any, limit: int, what: str) -> str:
    """Encode like :func:`dumps`, then enforce the payload byte ceiling.

    The text of :func:`encode_limited` (same arguments and errors).
    """
    return encode_limited(value, limit, what).text


def encode_limited(value: Any, limit: int, what: str) -> Encoded:
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
    plain = check_depth(value, what)
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
    return Encoded(text, plain)


class DuplicateKey(ValueError):
    """A JSON object names the same key twice (``key``)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing a key given twice in one object.

    Raises:
        DuplicateKey: the first repeated key. Two parsers may keep different values of a
            repeated key (docs/api.md, "Strict JSON"), so it is refused, never resolved.
    """
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_text(text: str, what: str) -> Any:
    """Decode JSON a person typed (a console field, a CLI option) under the API's rules.

    The same refusals as a request body (app/api/request_guards.py) and a payload
    (:func:`check_depth`), so a value the API would refuse is never re-encoded into one it
    accepts: invalid JSON (with line and column), a key repeated in one object, NaN or
    Infinity, an integer past ``sys.get_int_max_str_digits()`` digits, nesting deeper than
    :data:`MAX_DEPTH`, a lone surrogate. ``what`` names the value in the message ("The
    payload", "--input").

    Raises:
        InvalidInput: why, naming ``what``; nothing was sent.
    """
    try:
        value = json.loads(text, object_pairs_hook=unique_object, parse_constant=_refuse_constant)
    except DuplicateKey as exc:
        raise InvalidInput(
            f"{what} repeats the key {exc.key[:64]!r} in one object; keys must be unique"
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise InvalidInput(f"{what} is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        # A NaN/Infinity constant, or an integer Python refuses to convert (its digit
        # limit, CVE-2020-10735).
        raise InvalidInput(
            f"{what} holds a number JSON cannot carry (NaN, Infinity, or an integer of "
            f"more than {sys.get_int_max_str_digits()} digits: send that as a string)"
        ) from None
    check_depth(value, what)
    return value
