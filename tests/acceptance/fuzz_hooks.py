"""Schemathesis hooks for ``test_fuzz.py`` (loaded through ``SCHEMATHESIS_HOOKS``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import schemathesis


@schemathesis.hook
def before_call(
    context: schemathesis.HookContext, case: schemathesis.Case[Any], kwargs: Any
) -> None:
    """Cap long polls at 1 s; page instead of following event streams.

    ``GET /runs/{id}/result?wait=`` may legitimately hold a request for up to 300 s; the
    fuzzer would spend its whole budget waiting. Values that are not numbers stay as
    generated, so the negative cases still reach the API. ``GET /runs/{id}/events
    ?follow=true`` streams until the run ends, which a waiting run never does, and the
    fuzzer reads a body to its end: it gets the page form (streams are tested in
    tests/acceptance/test_event_stream.py).
    """
    query = case.query
    if query and str(query.get("follow", "")).lower() in ("true", "1", "yes", "on"):
        query["follow"] = "false"
    if not query or "wait" not in query:
        return
    try:
        wait = float(query["wait"])
    except (TypeError, ValueError):
        return
    if wait > 1:
        query["wait"] = 1


ECHO = "acc-echo"
VALID_CRONS = frozenset({"*/5 * * * *", "0 3 * * *", "30 2 * * 1-5", "0 0 1 1 *"})


@schemathesis.hook
def map_body(context: schemathesis.HookContext, body: Any) -> Any:
    """Let a share of generated submissions and schedules through to the engine.

    A generated ``input`` rarely matches a registered workflow's schema, so almost every
    ``POST /runs`` and ``POST /schedules`` stopped at 422 and the resources that the
    stateful phase follows (via the spec's links) were never created. When the body
    names ``acc-echo`` (whose input is ``{"value": <any JSON>}``), the generated input is
    wrapped as its ``value``: the arbitrary JSON still reaches storage and comes back.
    Such a schedule gets exactly one of ``cron`` and ``at`` (the spec cannot say "one of
    two optional fields", so most generated ones have neither or both): a generated
    ``at`` is dropped when ``cron`` holds a valid expression (from the seeded
    dictionary), and a valid one is supplied when neither is set. A webhook's generated
    ``url`` becomes a path on 127.0.0.1. Every other body is left as generated.
    """
    operation = context.operation
    if operation is None or operation.method.upper() != "POST" or not isinstance(body, dict):
        return body
    if operation.path == "/webhooks" and isinstance(body.get("url"), str):
        # A generated URL almost never names a reachable public host, so the target guard
        # refused every one (422). It becomes a path on 127.0.0.1 (allowed in the fuzz
        # stack): the generated text still reaches storage and comes back.
        return {**body, "url": "http://127.0.0.1:9/" + quote(body["url"], safe="")[:1500]}
    if operation.path not in ("/runs", "/schedules") or body.get("workflow") != ECHO:
        return body
    body = {**body, "input": {"value": body.get("input")}}
    if operation.path == "/schedules":
        if body.get("cron") in VALID_CRONS:
            body.pop("at", None)
        elif body.get("cron") is None and body.get("at") is None:
            body["cron"] = min(VALID_CRONS)
    return body
