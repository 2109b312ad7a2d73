"""A query parameter that takes one value, given twice, is refused (422), on every operation.

FastAPI keeps the last of ``?limit=1&limit=2`` for a parameter typed as one value and
says nothing: ``status=failed&status=completed`` once listed completed runs, silently.
Which parameters take one value is read from the route table, not kept by hand: every
query parameter an operation declares (its own, its dependencies', the fields of a query
model such as ``RunFilterQuery``) whose type is not a sequence, decided by the same
FastAPI helper that decides whether FastAPI reads one value or all of them. A list-typed
parameter (``list[str]``) still takes every repetition. Parameters an operation does not
declare are its own business (``label.<key>`` of ``GET /runs``, which refuses its own
repeats with :func:`repeated`).

The refusal is ``422 invalid_input``, ``errors: [{"path": "query.<name>", "message":
"repeated"}]`` (docs/api.md, "Errors"), before the operation's own dependencies (the
token is not looked at: which parameters take one value is public, in the OpenAPI
document) and before anything is read or done.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import Depends, Request
from fastapi._compat import field_annotation_is_sequence
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import BaseModel

from app.core.errors import InvalidInput

_SHOWN_CHARS = 80


def repeated(names: list[str]) -> InvalidInput:
    """The refusal of query parameters given more than once (``names``, in request order).

    ``detail`` names the first; ``errors`` has one ``{"path": "query.<name>", "message":
    "repeated"}`` per name. Names are cut to 80 characters in the answer.
    """
    first = names[0][:_SHOWN_CHARS]
    return InvalidInput(
        f"query parameter {first!r} is given more than once; it takes one value",
        errors=[{"path": f"query.{n[:_SHOWN_CHARS]}", "message": "repeated"} for n in names],
    )


def _query_fields(dependant: Dependant) -> Iterator[tuple[str, object]]:
    # (name the client sends, annotation) of every query parameter the operation reads,
    # its dependencies' included; a query model contributes its fields.
    for field in dependant.query_params:
        annotation = field.field_info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            for name, info in annotation.model_fields.items():
                alias = info.validation_alias if isinstance(info.validation_alias, str) else None
                yield alias or info.alias or name, info.annotation
        else:
            yield field.alias, annotation
    for sub in dependant.dependencies:
        yield from _query_fields(sub)


def single_valued(dependant: Dependant) -> frozenset[str]:
    """Names of the query parameters of ``dependant`` that take one value (not list-typed)."""
    return frozenset(
        name
        for name, annotation in _query_fields(dependant)
        if not field_annotation_is_sequence(annotation)
    )


# Single-valued names per route, computed at a route's first request. Keyed by id():
# routes live as long as the app and are unhashable (Starlette routes define __eq__);
# the route is kept with its names, so an id is never reused while cached.
_NAMES: dict[int, tuple[APIRoute, frozenset[str]]] = {}


def _names_of(route: APIRoute) -> frozenset[str]:
    cached = _NAMES.get(id(route))
    if cached is None or cached[0] is not route:
        cached = (route, single_valued(route.dependant))
        _NAMES[id(route)] = cached
    return cached[1]


async def refuse_repeated_query(request: Request) -> None:
    """Dependency of every API operation: refuse a one-value query parameter given twice.

    The operation is the route FastAPI matched (``request.scope["route"]``); its
    single-valued parameters are :func:`single_valued` of its dependant. Included with
    each API router by :func:`app.api.app.create_app`, so a new router or parameter is
    covered without a list to keep (``tests/acceptance/test_repeated_query.py`` walks
    every operation of the OpenAPI document).

    Raises:
        InvalidInput: :func:`repeated` of the names given more than once (422).
    """
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    names = _names_of(route)
    query = request.query_params
    found = [n for n in dict.fromkeys(query.keys()) if n in names and len(query.getlist(n)) > 1]
    if found:
        raise repeated(found)


REFUSE_REPEATED = Depends(refuse_repeated_query)
"""``dependencies=[REFUSE_REPEATED]`` of every API router's inclusion."""
