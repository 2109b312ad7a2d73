"""ASGI middlewares that guard how a request body is read: its time and its JSON.

- :class:`BodyReadTimeout` bounds the time a client may take to send its body
  (``TREADLE_BODY_READ_TIMEOUT_SECONDS``): a client trickling a byte every few seconds
  gets ``408 request_timeout`` and the connection is closed, instead of holding a
  connection and a request task forever (slowloris). The request *head* is bounded one
  layer down, in the HTTP protocol (:mod:`app.api.server`), since the app only sees a
  request once its head is complete.
- :class:`StrictJsonBody` accepts only RFC 8259 JSON texts on every JSON-accepting
  endpoint: UTF-8 without a byte order mark, ``charset`` absent or ``utf-8``, and no
  object with the same key twice at any depth. Python's ``json`` (which FastAPI uses)
  would guess UTF-16/32 from the bytes and keep the last of two equal keys, while a
  proxy or an audit tool in front of us may read the first: the same bytes must not mean
  two things (RFC 8259 §4 and §8.1, RFC 7493 "I-JSON" §2.3).
"""

from __future__ import annotations

import asyncio
import codecs
import email.message
import json
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api import problems


class BodyReadTimeout:
    """ASGI middleware: a request body must arrive whole within ``seconds`` (408).

    The clock starts when the app is called (the request head is complete) and only runs
    while the body is incomplete: once its last byte arrived, ``receive()`` waits for a
    disconnect as long as the app likes (long-polls). On expiry the request gets
    ``408 request_timeout`` with ``Connection: close`` (RFC 9110 §15.5.9): nothing was
    read whole, so nothing was stored.

    Args:
        app: the wrapped ASGI app.
        seconds: the bound, ``TREADLE_BODY_READ_TIMEOUT_SECONDS``.
    """

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        complete = False

        async def timed() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimedOut(self.seconds) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, timed, tracked)
        except BodyTimedOut as exc:
            # Raised where no exception handler runs (another middleware reading the
            # body); inside a route FastAPI re-raises it to problems._http_error.
            if started:
                return  # already answering (a streamed response): the server closes
            await timeout_problem(exc.seconds, scope.get("path"))(scope, receive, send)


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


def timeout_problem(seconds: float, instance: str | None) -> JSONResponse:
    """The ``408 request_timeout`` problem response, closing the connection."""
    return problems.problem(
        408,
        "request_timeout",
        f"request body not received within {seconds:g} s",
        instance=instance,
        headers={"Connection": "close"},
        timeout_seconds=seconds,
    )


class DuplicateKey(ValueError):
    """A JSON object of the body names the same key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


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
        json.loads(text, object_pairs_hook=_unique_object)
    except DuplicateKey as exc:
        return f"request body repeats the key {exc.key[:64]!r} in one object; keys must be unique"
    except json.JSONDecodeError as exc:
        return f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
    except RecursionError:
        return None
    return None


class StrictJsonBody:
    """ASGI middleware: refuse JSON bodies that are not strict UTF-8 JSON (400).

    Applies to every request whose ``Content-Type`` is ``application/json`` or
    ``application/*+json`` (the bodies FastAPI parses as JSON), so every JSON-accepting
    endpoint is covered, present and future. The body (already bounded in size and time
    by the middlewares around this one) is read whole, checked by
    :func:`check_json_body`, then handed to the app unchanged. Refusals are
    ``400 malformed_json`` with a detail naming the problem; nothing is stored.

    Args:
        app: the wrapped ASGI app.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        content_type = None
        for name, value in scope.get("headers", []):
            if name == b"content-type":
                content_type = value.decode("latin-1")
        if content_type is None:
            await self.app(scope, receive, send)
            return
        is_json, charset = _is_json_media(content_type)
        if not is_json:
            await self.app(scope, receive, send)
            return
        if charset is not None and charset.strip().lower() != "utf-8":
            await self._refuse(
                scope,
                receive,
                send,
                f"charset {charset[:40]!r} is not accepted: JSON bodies are UTF-8 "
                "(send charset=utf-8 or none)",
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
            await self._refuse(scope, receive, send, reason)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, detail: str) -> None:
        response = problems.problem(400, "malformed_json", detail, instance=scope.get("path"))
        await response(scope, receive, send)
