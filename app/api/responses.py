"""Response classes that can send any string the API accepts.

JSON is escaped to ASCII, as the stored payloads are (``app.core.json``); plain text goes
through :func:`app.core.text.printable`. Either way no value (a lone surrogate, NUL, a
control or bidi character) can fail to encode mid-response or rewrite what a reader
sees (docs/security.md).
"""

from __future__ import annotations

import json as stdjson
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse

from app.core.text import printable


class AsciiJSONResponse(JSONResponse):
    """JSON responses escaped to ASCII.

    Lone surrogates and NUL in payloads render as escapes instead of failing to encode,
    so payloads round-trip exactly.
    """

    def render(self, content: Any) -> bytes:
        """Serialise like the stored payloads (``app.core.json``)."""
        return stdjson.dumps(
            content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode("ascii")


class SafeTextResponse(PlainTextResponse):
    r"""``text/plain; charset=utf-8`` whose body always encodes.

    Line breaks are kept (they are the renderer's layout); every other invisible or
    unencodable character is escaped by :func:`app.core.text.printable`, a last line of
    defence behind renderers that already escape each value.
    """

    def render(self, content: Any) -> bytes:
        """Encode ``content`` (a str) as UTF-8 after escaping what plain text cannot show."""
        if isinstance(content, bytes):
            return content
        return printable(str(content), keep="\n").encode("utf-8")
