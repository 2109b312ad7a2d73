"""``app.api.query_params``: which query parameters take one value, read from the route.

A small app of its own (no database) declares every kind the API uses or might: a plain
parameter, an alias, a list-typed one (``list[str]``, ``list[int] | None``), a query
model with a single-valued and a list-typed field, and one in a dependency. Each
single-valued one given twice is ``422`` in the API's problem shape; each list-typed one
takes every repetition, as FastAPI reads it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Query
from pydantic import BaseModel

from app.api import problems, query_params


class Filters(BaseModel):
    """A query model: flattened into the query by FastAPI."""

    kind: str | None = None
    tags: list[str] = []


async def paging(cursor: str | None = None) -> str | None:
    """A dependency with a query parameter of its own."""
    return cursor


router = APIRouter()


@router.get("/things")
async def things(
    filters: Annotated[Filters, Query()],
    cursor: Annotated[str | None, Depends(paging)],
    limit: int = 10,
    sort_by: Annotated[str | None, Query(alias="sort-by")] = None,
    status: Annotated[list[str] | None, Query()] = None,
    ids: Annotated[list[int], Query()] = [],  # noqa: B006 - FastAPI copies defaults
) -> dict[str, object]:
    """Echo what FastAPI read."""
    return {
        "kind": filters.kind,
        "tags": filters.tags,
        "cursor": cursor,
        "limit": limit,
        "sort_by": sort_by,
        "status": status,
        "ids": ids,
    }


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    problems.install(app)
    app.include_router(router, dependencies=[query_params.REFUSE_REPEATED])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


@pytest.mark.parametrize(
    ("name", "value"), [("limit", "3"), ("sort-by", "a"), ("kind", "k"), ("cursor", "c")]
)
async def test_a_single_valued_parameter_given_twice_is_422(
    client: httpx.AsyncClient, name: str, value: str
) -> None:
    r = await client.get("/things", params=[(name, value), (name, value)])
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == problems.PROBLEM_JSON
    body = r.json()
    assert body["code"] == "invalid_input"
    assert body["errors"] == [{"path": f"query.{name}", "message": "repeated"}]
    assert body["detail"] == f"query parameter {name!r} is given more than once; it takes one value"
    once = await client.get("/things", params=[(name, value)])
    assert once.status_code == 200, once.text


async def test_list_typed_parameters_take_every_repeat(client: httpx.AsyncClient) -> None:
    r = await client.get(
        "/things",
        params=[
            ("status", "a"),
            ("status", "b"),
            ("ids", "1"),
            ("ids", "2"),
            ("tags", "x"),
            ("tags", "y"),
            ("limit", "4"),
        ],
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "kind": None,
        "tags": ["x", "y"],
        "cursor": None,
        "limit": 4,
        "sort_by": None,
        "status": ["a", "b"],
        "ids": [1, 2],
    }


async def test_undeclared_parameters_are_left_to_the_route(client: httpx.AsyncClient) -> None:
    # Not declared: the route's own business (GET /runs reads label.<key> itself).
    r = await client.get("/things", params=[("other", "1"), ("other", "2")])
    assert r.status_code == 200, r.text


def test_single_valued_names_come_from_the_route_table() -> None:
    (route,) = [r for r in router.routes if getattr(r, "path", "") == "/things"]
    assert query_params.single_valued(route.dependant) == {  # type: ignore[attr-defined]
        "limit",
        "sort-by",
        "kind",
        "cursor",
    }
