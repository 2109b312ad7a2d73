"""Schemathesis hooks for ``test_fuzz.py`` (loaded through ``SCHEMATHESIS_HOOKS``)."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def before_call(
    context: schemathesis.HookContext, case: schemathesis.Case[Any], kwargs: Any
) -> None:
    """Cap long polls at 1 s.

    ``GET /runs/{id}/result?wait=`` may legitimately hold a request for up to 300 s; the
    fuzzer would spend its whole budget waiting. Values that are not numbers stay as
    generated, so the negative cases still reach the API.
    """
    query = case.query
    if not query or "wait" not in query:
        return
    try:
        wait = float(query["wait"])
    except (TypeError, ValueError):
        return
    if wait > 1:
        query["wait"] = 1
