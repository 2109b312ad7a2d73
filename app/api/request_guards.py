"""The ASGI middleware that guards how a request is read: head size, body size and time, JSON.

:class:`RequestGuards` is one layer (it was three, each wrapping ``receive``; merged
without a change of behaviour, docs/adr/0035-http-parser.md "Middleware"). In order:

- **Head size**: request headers totalling over ``TREADLE_MAX_HEADER_BYTES`` get ``431``.
  The HTTP server (h11) already stops reading a request head that grows past that size,
  but only checks between socket reads, so this makes the ceiling exact.
- **Body size**: a ``Content-Length`` over the limit, or more bytes streamed than it,
  get ``413 payload_too_large``; an oversized body is never buffered whole.
- **Body time** (``TREADLE_BODY_READ_TIMEOUT_SECONDS``): a client trickling a byte every
  few seconds gets ``408 request_timeout`` and the connection is closed, instead of
  holding a connection and a request task forever (slowloris). The request *head* is
  bounded one layer down, in the HTTP protocol (:mod:`app.api.server`), since the app
  only sees a request once its head is complete.
- **Strict JSON** on every JSON-accepting endpoint: UTF-8 without a byte order mark,
  ``charset`` absent or ``utf-8``, and no object with the same key twice at any depth.
  Python's ``json`` (which FastAPI uses) would guess UTF-16/32 from the bytes and keep
  the last of two equal keys, while a proxy or an audit tool in front of us may read the
  first: the same bytes must not mean two things (RFC 8259 §4 and §8.1, RFC 7493
  "I-JSON" §2.3).
"""

from __future__ import annotations

import asyncio
import codecs
import email.message
import json
import sys

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.problems import Problem, ProblemPages
from app.core.json import DuplicateKey, unique_object


class BodyTimedOut(StarletteHTTPException):
    """The request body did not arrive within the bound (408).

    An ``HTTPException`` so that FastAPI's body reader re-raises it (instead of a generic
    400) and ``app.api.problems`` renders it; it carries ``Connection: close``.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__(
            408,
            f"request body not received within {seconds:g} s",
            headers={"Connection": "close"},
        )
        self.seconds = seconds


def timeout_problem(seconds: float) -> Problem:
    """The ``408 request_timeout`` problem, closing the connection."""
    return Problem(
        408,
        "request_timeout",
        f"request body not received within {seconds:g} s",
        {"Connection": "close"},
        {"timeout_seconds": seconds},
    )


def _is_json_media(content_type: str) -> tuple[bool, str | None]:
    # Parsed the way FastAPI decides to read a body as JSON (email.message), so both
    # agree on which requests are JSON.
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False, None
    subtype = message.get_content_subtype()
    charset = message.get_param("charset")
    return (subtype == "json" or subtype.endswith("+json")), (
        None if charset is None else str(charset)
    )


_BOMS = (
    codecs.BOM_UTF8,
    codecs.BOM_UTF32_LE,
    codecs.BOM_UTF32_BE,
    codecs.BOM_UTF16_LE,
    codecs.BOM_UTF16_BE,
)


def check_json_body(body: bytes) -> str | None:
    """Why ``body`` is not a JSON text we accept, or None when it is (or is empty).

    Refused: a byte order mark; any encoding but UTF-8 (UTF-16/32 are recognised by
    their NUL pattern, RFC 4627 §3); bytes that are not UTF-8; invalid JSON; an object
    with a duplicate key at any depth. A body nested too deep for the parser is let
    through: the route answers it with ``422 invalid_input`` as before.
    """
    if not body:
        return None
    if body.startswith(_BOMS):
        return "request body starts with a byte order mark; send UTF-8 JSON without one"
    encoding = json.detect_encoding(body)
    if encoding != "utf-8":
        return f"request body is {encoding.upper()}, not UTF-8; JSON must be UTF-8"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "request body is not valid UTF-8"
    try:
        json.loads(text, object_pairs_hook=unique_object)
    except DuplicateKey as exc:
        return f"request body repeats the key {exc.key[:64]!r} in one object; keys must be unique"
    except json.JSONDecodeError as exc:
        return f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    except RecursionError:
        return None
    except ValueError:
        # Python refuses to convert an integer of more digits than
        # sys.get_int_max_str_digits() (4300; conversion is quadratic, CVE-2020-10735):
        # valid JSON we cannot read, refused here rather than failing the route (500).
        return (
            "request body has an integer of more than "
            f"{sys.get_int_max_str_digits()} digits; send it as a string"
        )
    return None


class BodyTooLarge(StarletteHTTPException):
    """The request body streamed past the size limit (413).

    An ``HTTPException`` so that FastAPI's body reader re-raises it instead of wrapping
    it in a generic 400 "error parsing the body".
    """

    def __init__(self) -> None:
        super().__init__(413, "request body too large")


def _exceeds(content_length: bytes, limit: int) -> bool:
    # A malformed Content-Length is the HTTP server's to refuse, not a size problem.
    try:
        return int(content_length) > limit
    except ValueError:
        return False


def _too_large(limit: int) -> Problem:
    return Problem(
        413,
        "payload_too_large",
        f"request body exceeds {limit} bytes",
        extra={"limit_bytes": limit},
    )


class RequestGuards:
    """ASGI middleware: bound a request's head size, body size and time; strict JSON.

    Head over ``header_limit`` bytes (names, values and 4 bytes of punctuation each):
    ``431 headers_too_large``. Body over ``body_limit`` bytes (``Content-Length`` up
    front, or counted as it streams): ``413 payload_too_large``. Body not whole within
    ``body_seconds`` of the app being called (the head is complete then): ``408
    request_timeout`` with ``Connection: close`` (RFC 9110 §15.5.9); once its last byte
    arrived, ``receive()`` waits for a disconnect as long as the app likes (long-polls).
    A JSON body (``application/json`` or ``application/*+json``, the bodies FastAPI
    parses as JSON) is read whole, checked by :func:`check_json_body`, then handed to
    the app unchanged; a refusal is ``400 malformed_json`` naming the problem. Nothing
    refused was stored.

    Every refusal is rendered by ``pages`` (:class:`app.api.problems.ProblemPages`), as
    the exception handlers' are: problem+json, or the HTML page of a prefix that
    registered one (the console's ``/ui``), whichever layer refused.

    Args:
        app: the wrapped ASGI app.
        body_limit: ``TREADLE_MAX_PAYLOAD_BYTES`` plus room for the envelope.
        header_limit: ``TREADLE_MAX_HEADER_BYTES``.
        body_seconds: ``TREADLE_BODY_READ_TIMEOUT_SECONDS``.
        pages: how refusals are rendered per path prefix (default: problem+json only).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        body_limit: int,
        header_limit: int,
        body_seconds: float,
        pages: ProblemPages | None = None,
    ) -> None:
        self.app = app
        self.body_limit = body_limit
        self.header_limit = header_limit
        self.body_seconds = body_seconds
        self.pages = pages or ProblemPages()

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, found: Problem) -> None:
        response = await self.pages.respond(Request(scope, receive), found)
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.body_seconds
        headers = scope.get("headers", [])
        header_bytes = 0
        content_type: str | None = None
        too_big = False
        for name, value in headers:
            header_bytes += len(name) + len(value) + 4
            if name == b"content-length":
                too_big = too_big or _exceeds(value, self.body_limit)
            elif name == b"content-type":
                content_type = value.decode("latin-1")
        if header_bytes > self.header_limit:
            found = Problem(
                431,
                "headers_too_large",
                f"request headers exceed {self.header_limit} bytes",
                extra={"limit_bytes": self.header_limit},
            )
            await self._refuse(scope, receive, send, found)
            return
        if too_big:
            await self._refuse(scope, receive, send, _too_large(self.body_limit))
            return
        complete = False
        seen = 0

        async def guarded() -> Message:
            nonlocal complete, seen
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimedOut(self.body_seconds) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.body_limit:
                    raise BodyTooLarge()
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if content_type is None:
                await self.app(scope, guarded, tracked)
            else:
                await self._json(scope, guarded, tracked, content_type)
        except BodyTooLarge:
            await self._refuse(scope, receive, send, _too_large(self.body_limit))
        except BodyTimedOut as exc:
            # Raised where no exception handler runs (the JSON check reading the body);
            # inside a route FastAPI re-raises it to problems._http_error.
            if started:
                return  # already answering (a streamed response): the server closes
            await self._refuse(scope, receive, send, timeout_problem(exc.seconds))

    async def _json(self, scope: Scope, receive: Receive, send: Send, content_type: str) -> None:
        is_json, charset = _is_json_media(content_type)
        if not is_json:
            await self.app(scope, receive, send)
            return
        if charset is not None and charset.strip().lower() != "utf-8":
            await self._refuse(
                scope,
                receive,
                send,
                _malformed(
                    f"charset {charset[:40]!r} is not accepted: JSON bodies are UTF-8 "
                    "(send charset=utf-8 or none)"
                ),
            )
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was complete
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        reason = check_json_body(body)
        if reason is not None:
            await self._refuse(scope, receive, send, _malformed(reason))
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _malformed(detail: str) -> Problem:
    return Problem(400, "malformed_json", detail)
