r"""Safe plain text: any string the JSON side accepts, rendered for a terminal or a log.

JSON views escape what they must (``ensure_ascii``), so a lone surrogate, NUL or an RTL
override in an error message, a step name or a payload round-trips there. Plain text has
no escape syntax: a lone surrogate cannot be encoded as UTF-8 at all (the response fails
mid-send), and control, format and bidirectional characters rewrite what a reader sees
(``\n`` forges a report line, ESC drives the terminal, U+202E reverses the rest of the
line). :func:`printable` escapes exactly those, the way JSON would spell them, and keeps
every other character (accents, CJK, emoji) as it is. See docs/security.md.

Also :func:`text_problem`, the one rule for text a client *gives* Treadle as an
identifier or an operator's words (idempotency and concurrency keys, versions, reasons,
comments, names, the filters that match them), which the API, the console and the CLI
share; and :func:`human_duration`, the one spelling of a duration in text meant for
people (the run report).
"""

from __future__ import annotations

import math
import re
import unicodedata

# Unicode general categories a reader cannot see as themselves: control (Cc: C0, DEL,
# C1), format (Cf: bidi embeddings/overrides/isolates, zero-width characters, BOM, soft
# hyphen), surrogate (Cs: only ever lone in a Python str) and the line and paragraph
# separators (Zl, Zp), which some viewers break lines on.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    # Outside the BMP, JSON's own spelling: a surrogate pair of escapes.
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def printable(text: str, *, keep: str = "") -> str:
    r"""``text`` with every invisible or unencodable character escaped as ``\uXXXX``.

    Args:
        text: any string (lone surrogates and NUL included).
        keep: characters to leave as they are (e.g. ``"\n"`` for text whose line
            breaks are the renderer's own, such as a traceback).

    Returns:
        A string that encodes as UTF-8 and shows every character it holds: those of
        categories Cc, Cf, Cs, Zl and Zp become ``\uXXXX`` (astral ones a surrogate pair
        of escapes, as JSON writes them), so an escaped JSON document stays valid JSON.
        Everything else, backslashes included, is unchanged.
    """
    if text.isprintable() and not keep:
        return text  # the common case: nothing to escape (isprintable is stricter)
    return "".join(
        _escape(c) if c not in keep and unicodedata.category(c) in _HIDDEN_CATEGORIES else c
        for c in text
    )


BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
"""The bidirectional control characters (Unicode UAX #9, "Explicit Directional
Formatting" and the implicit marks): ALM U+061C, LRM/RLM U+200E/U+200F, the embeddings
and overrides U+202A..U+202E and the isolates U+2066..U+2069. In an identifier they make
two keys that look alike differ and reorder what a reader sees (``order-\u202e1fdp.exe``)."""

_CONTROLS = r"\x00-\x1f\x7f-\x9f"
_BIDI = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
TEXT_PATTERN = f"^[^{_CONTROLS}{_BIDI}]*$"
""":func:`text_problem` as a regular expression, for the OpenAPI document's ``pattern``
(lone surrogates aside, which no JSON document can carry as text)."""

_REFUSED = re.compile(f"[{_CONTROLS}{_BIDI}]")


def text_problem(value: str) -> str | None:
    r"""Why ``value`` cannot be a text field a client gives Treadle, or None when it can.

    The rule (docs/api.md, "Conventions", "Text fields"): no control character (C0
    ``\x00``-``\x1f``, DEL, C1 ``\x80``-``\x9f``: NUL cannot be stored by PostgreSQL, CR
    and LF forge log lines), no bidirectional control (:data:`BIDI_CONTROLS`), no lone
    surrogate (not encodable as UTF-8). Everything else is kept (accents, CJK, emoji with
    their joiners). One regex search: every item of a 1,000-run batch passes here.
    Payload values (run input, signal payloads) are data, never checked by this.

    Returns:
        None, or a message naming the first refused character as ``U+XXXX``.
    """
    found = _REFUSED.search(value)
    if found is not None:
        char = found.group()
        kind = "bidirectional control" if char in BIDI_CONTROLS else "control"
        return f"{kind} characters are not allowed (U+{ord(char):04X} at index {found.start()})"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"not valid unicode (lone surrogate U+{ord(value[exc.start]):04X})"
    return None


def checked_text(value: str) -> str:
    """``value`` itself if :func:`text_problem` finds nothing: a validator for typed models.

    The API's identifier fields and the console's query parameters wrap it in pydantic's
    ``AfterValidator``, so a refusal is that field's validation error.

    Raises:
        ValueError: :func:`text_problem`'s message.
    """
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def human_duration(seconds: float) -> str:
    """A duration for a reader: ``0.4 ms``, ``999 ms``, ``59.9 s``, ``1 min 5 s``, ``3 d 4 h``.

    The unit is the largest that keeps the number at least 1, with the precision an
    operator reads at that scale: below 10 ms one decimal, below 1 s whole milliseconds,
    below a minute one decimal of a second, then two units (whole minutes and seconds,
    hours and minutes, days and hours; a zero second unit is left out). The value is
    rounded before the unit is chosen, so 0.9996 s reads ``1.0 s``, never ``1000 ms``,
    and 59.96 s reads ``1 min``.

    Args:
        seconds: a finite, non-negative duration in seconds.

    Raises:
        ValueError: ``seconds`` is negative, NaN or infinite.
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration must be a finite number of seconds >= 0, not {seconds!r}")
    millis = seconds * 1000
    if millis < 9.95:
        return f"{millis:.1f} ms"
    if millis < 999.5:
        return f"{millis:.0f} ms"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    total = round(seconds)
    if total < 3600:
        return _two(*divmod(total, 60), "min", "s")
    minutes = round(seconds / 60)
    if minutes < 24 * 60:
        return _two(*divmod(minutes, 60), "h", "min")
    return _two(*divmod(round(seconds / 3600), 24), "d", "h")


def _two(big: int, small: int, big_unit: str, small_unit: str) -> str:
    return f"{big} {big_unit}" + (f" {small} {small_unit}" if small else "")
