"""Run labels: the rules for keys and values, and the ``label.<key>=`` filter syntax.

One module for every place a label enters Treadle (``POST /runs``, ``ctx.set_label``,
``inherit_labels`` children, the ``GET /runs`` filters), so all of them refuse the same
things with the same message (docs/adr/0020-run-labels.md, docs/api.md "Labels").

Rules:

- at most :data:`MAX_LABELS` labels per run (submitted and set by the workflow together);
- a key is 1..:data:`MAX_KEY_LENGTH` characters of ``A-Z a-z 0-9 _ . - /``, starting
  with a letter or digit (:data:`KEY_PATTERN`);
- a value is 1..:data:`MAX_VALUE_LENGTH` printable characters in Unicode NFC, without
  ``*`` (reserved for prefix filters): no control or format characters (NUL, zero-width
  space, bidi overrides), no lone surrogates, so equal-looking values are equal bytes and
  an equality query finds them.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.errors import InvalidInput

MAX_LABELS = 16
MAX_KEY_LENGTH = 64
MAX_VALUE_LENGTH = 256
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,63}$"
_KEY = re.compile(KEY_PATTERN)


def key_problem(key: object) -> str | None:
    """Why ``key`` is not a valid label key, or None when it is."""
    if not isinstance(key, str):
        return "label keys are strings"
    if not key or len(key) > MAX_KEY_LENGTH:
        return f"label keys are 1..{MAX_KEY_LENGTH} characters"
    if not _KEY.fullmatch(key):
        return "label keys use only A-Z a-z 0-9 _ . - / and start with a letter or digit"
    return None


def value_problem(value: object) -> str | None:
    """Why ``value`` is not a valid label value, or None when it is."""
    if not isinstance(value, str):
        return "label values are strings"
    if not value or len(value) > MAX_VALUE_LENGTH:
        return f"label values are 1..{MAX_VALUE_LENGTH} characters"
    if not value.isprintable():
        # isprintable() is False for control (Cc), format (Cf, e.g. U+200B, U+202E),
        # surrogate (Cs), private-use-free separators other than space: exactly the
        # characters that make two equal-looking values differ.
        return "label values may not contain control, format or surrogate characters"
    if "*" in value:
        return "label values may not contain '*' (it marks a prefix in a filter)"
    if not unicodedata.is_normalized("NFC", value):
        return "label values must be in Unicode NFC (compose accents: é, not e + U+0301)"
    return None


def validate_labels(labels: Mapping[Any, Any] | None, path: str = "labels") -> dict[str, str]:
    """Check a ``{key: value}`` mapping against the rules; returns it as a plain dict.

    Raises:
        InvalidInput: over :data:`MAX_LABELS`, or any key or value invalid (422; each
            problem listed with its path ``labels.<key>``, at most 20).
    """
    if not labels:
        return {}
    errors: list[dict[str, str]] = []
    if len(labels) > MAX_LABELS:
        errors.append({"path": path, "message": f"at most {MAX_LABELS} labels, got {len(labels)}"})
    for key, value in labels.items():
        where = f"{path}.{str(key)[:MAX_KEY_LENGTH]}"
        problem = key_problem(key) or value_problem(value)
        if problem is not None:
            errors.append({"path": where, "message": problem})
    if errors:
        raise InvalidInput(f"labels are invalid: {errors[0]['message']}", errors=errors[:20])
    return {str(k): str(v) for k, v in labels.items()}


@dataclass(frozen=True, slots=True)
class LabelFilter:
    """One ``label.<key>=<value>`` query filter: equality, or a prefix when ``prefix``."""

    key: str
    value: str
    prefix: bool = False


def parse_label_filter(name: str, raw: str) -> LabelFilter:
    """Parse the query parameter ``name`` (``label.<key>``) with value ``raw``.

    ``raw`` ending in ``*`` is a prefix match on the rest (which may be empty only when
    it is not: ``label.k=*`` is refused, use no filter to match every value).

    Raises:
        InvalidInput: the key or value breaks the label rules (422, path ``query.<name>``).
    """
    key = name[len("label.") :]
    prefix = raw.endswith("*")
    value = raw[:-1] if prefix else raw
    problem = key_problem(key) or value_problem(value)
    if problem is not None:
        raise InvalidInput(
            f"filter {name[:80]!r}: {problem}",
            errors=[{"path": f"query.{name[:80]}", "message": problem}],
        )
    return LabelFilter(key=key, value=value, prefix=prefix)


def prefix_upper_bound(prefix: str) -> str:
    """The least string above every string starting with ``prefix`` (codepoint order).

    ``value >= prefix AND value < bound`` is the prefix match as a range, which a plain
    B-tree index serves on both databases (PostgreSQL with the column's "C" collation,
    SQLite's BINARY collation: both compare UTF-8 bytes, i.e. codepoints).
    """
    # The prefix passed value_problem: printable, so its last character is below
    # U+10FFFF (a noncharacter, never printable) and has a successor.
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)
