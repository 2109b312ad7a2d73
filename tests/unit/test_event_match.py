"""Declarative event filters and matches (app/core/event_match.py, docs/adr/0029)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from app.core.event_match import MAX_ENTRIES, MatchError, check_match, matches
from app.sdk import WorkflowContext, workflow

DATA = {"order": {"id": "A1", "total": 10, "paid": True, "tags": ["x"]}, "n": None}


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        ({}, True),
        ({"order.id": "A1"}, True),
        ({"order.id": "A2"}, False),
        ({"order.total": 10.0}, True),  # one JSON number
        ({"order.total": "10"}, False),
        ({"order.paid": True}, True),
        ({"order.paid": 1}, False),  # JSON true is not 1, though Python says so
        ({"order.total": True}, False),
        ({"order.tags": ["x"]}, True),
        ({"order": {"id": "A1", "total": 10, "paid": True, "tags": ["x"]}}, True),
        ({"n": None}, True),
        ({"missing": None}, False),  # a missing path is not null
        ({"order.id.deeper": "A1"}, False),  # through a string
        ({"order.tags.0": "x"}, False),  # paths are object keys only
        ({"order.id": "A1", "order.total": 11}, False),  # every entry must hold
    ],
)
def test_matches(match: dict[str, Any], expected: bool) -> None:
    assert matches(check_match("match", match), DATA) is expected


def test_non_object_data_matches_only_the_empty_filter() -> None:
    assert matches({}, [1, 2])
    assert not matches({"a": 1}, [1, 2])
    assert not matches({"a": 1}, None)


@pytest.mark.parametrize(
    "bad",
    [
        ["order.id"],
        "order.id=1",
        {"": 1},
        {"a..b": 1},
        {".a": 1},
        {"x" * 201: 1},
        {1: 1},
        {"a": float("nan")},
        {"a": object()},
        {f"k{i}": i for i in range(MAX_ENTRIES + 1)},
    ],
)
def test_malformed_filters_are_refused(bad: Any) -> None:
    with pytest.raises(MatchError):
        check_match("match", bad)


def test_none_is_the_empty_filter() -> None:
    assert check_match("match", None) == {}


class Order(BaseModel):
    order_id: str


def test_workflow_declares_its_trigger_as_data() -> None:
    @workflow("t-paid", on_event="order.paid", event_filter={"currency": "EUR"})
    async def paid(ctx: WorkflowContext, order: Order) -> None:
        return None

    assert (paid.on_event, paid.event_filter) == ("order.paid", {"currency": "EUR"})

    @workflow("t-any", on_event="order.paid")
    async def any_paid(ctx: WorkflowContext, order: Order) -> None:
        return None

    assert any_paid.event_filter == {}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"on_event": "order paid"},
        {"on_event": ""},
        {"on_event": "ördér"},
        {"event_filter": {"a": 1}},  # a filter without an event
        {"on_event": "ok", "event_filter": {"a..b": 1}},
        {"on_event": "ok", "event_filter": ["a"]},
    ],
)
def test_workflow_refuses_a_malformed_trigger(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        workflow("t-bad", **kwargs)
