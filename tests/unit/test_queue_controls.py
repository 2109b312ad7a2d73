"""Validation of declared queue controls (app/sdk/queue.py), one case per rule and bound."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from app.sdk import workflow
from app.sdk.queue import QueueControls, QueueControlsError, RateLimit


class In(BaseModel):
    """Empty input."""


async def _body(ctx: Any, input: In) -> None:
    return None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key_limit": 0}, "key_limit: 0 is outside 1..1,000"),
        ({"key_limit": 1001}, "key_limit: 1001 is outside 1..1,000"),
        ({"key_limit": True}, "key_limit: True is not an integer"),
        ({"key_limit": 2.0}, "key_limit: 2.0 is not an integer"),
        ({"on_limit": "drop"}, "on_limit: 'drop' is not 'reject' or 'queue'"),
        ({"concurrency_limit": 0}, "concurrency_limit: 0 is outside 1..100,000"),
        ({"concurrency_limit": 100_001}, "concurrency_limit: 100001 is outside 1..100,000"),
        ({"rate_limit": 5}, "rate_limit: must be a RateLimit(per_second=...)"),
    ],
)
def test_workflow_rejects_out_of_range_controls(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(QueueControlsError) as err:
        workflow("w", **kwargs)(_body)
    assert str(err.value) == f"@workflow('w'): {message}"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"per_second": 0}, "rate_limit.per_second: 0 is outside (0, 10,000]"),
        ({"per_second": -1.5}, "rate_limit.per_second: -1.5 is outside (0, 10,000]"),
        ({"per_second": 10_000.5}, "rate_limit.per_second: 10000.5 is outside (0, 10,000]"),
        ({"per_second": float("nan")}, "rate_limit.per_second: nan is outside (0, 10,000]"),
        ({"per_second": float("inf")}, "rate_limit.per_second: inf is outside (0, 10,000]"),
        ({"per_second": "5"}, "rate_limit.per_second: must be a number"),
        ({"per_second": 1, "burst": 0}, "rate_limit.burst: 0 is outside 1..10,000"),
        ({"per_second": 1, "burst": 10_001}, "rate_limit.burst: 10001 is outside 1..10,000"),
        ({"per_second": 1, "by": "tenant"}, "rate_limit.by: 'tenant' is not 'workflow' or 'key'"),
    ],
)
def test_rate_limit_rejects_out_of_range(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(QueueControlsError) as err:
        RateLimit(**kwargs)
    assert str(err.value) == message


def test_boundaries_accepted_and_json_round_trips() -> None:
    for controls in [
        QueueControls(),
        QueueControls(key_limit=1_000, on_limit="queue"),
        QueueControls(concurrency_limit=1),
        QueueControls(concurrency_limit=100_000),
        QueueControls(rate_limit=RateLimit(per_second=10_000, burst=10_000, by="key")),
        QueueControls(rate_limit=RateLimit(per_second=0.001)),
    ]:
        assert QueueControls.from_json(controls.to_json()) == controls
    assert QueueControls.from_json(None).is_default
    assert RateLimit(per_second=4).interval_seconds == 0.25


def test_declared_controls_are_on_the_definition() -> None:
    rate = RateLimit(per_second=2, burst=3, by="key")
    d = workflow("w", key_limit=3, on_limit="queue", concurrency_limit=5, rate_limit=rate)(_body)
    assert d.queue == QueueControls(3, "queue", 5, rate)
    assert workflow("plain")(_body).queue.is_default
