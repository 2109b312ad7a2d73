"""RetryPolicy timing: each backoff, clamping, deterministic jitter bounds."""

from __future__ import annotations

import pytest

from app.sdk import RetryPolicy


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [
        ("fixed", [2.0, 2.0, 2.0, 2.0, 2.0]),
        ("linear", [2.0, 4.0, 6.0, 8.0, 10.0]),
        ("exponential", [2.0, 4.0, 8.0, 16.0, 32.0]),
    ],
)
def test_backoff_without_jitter(backoff: str, expected: list[float]) -> None:
    policy = RetryPolicy(max_attempts=10, backoff=backoff, delay=2.0, max_delay=1000)  # type: ignore[arg-type]
    assert [policy.delay_after(n, "seed") for n in range(1, 6)] == expected


def test_max_delay_clamps() -> None:
    policy = RetryPolicy(max_attempts=100, backoff="exponential", delay=1.0, max_delay=30.0)
    assert policy.delay_after(5, "s") == 16.0
    assert policy.delay_after(6, "s") == 30.0
    assert policy.delay_after(99, "s") == 30.0  # no overflow for huge attempt numbers


def test_jitter_is_bounded_and_replay_stable() -> None:
    policy = RetryPolicy(
        max_attempts=50, backoff="exponential", delay=1.0, max_delay=60.0, jitter=0.5
    )
    delays = []
    for attempt in range(1, 30):
        base = min(2.0 ** (attempt - 1), 60.0)
        d = policy.delay_after(attempt, "run-1:charge")
        assert base * 0.5 <= d <= base
        # Same inputs, same wait: a replay computes exactly what the first pass did.
        assert d == policy.delay_after(attempt, "run-1:charge")
        delays.append(d)
    # Different steps spread out (not all identical).
    others = [policy.delay_after(a, "run-2:charge") for a in range(1, 30)]
    assert delays != others


def test_zero_delay_and_full_jitter() -> None:
    assert RetryPolicy(delay=0.0, jitter=1.0).delay_after(3, "x") == 0.0
    d = RetryPolicy(backoff="fixed", delay=10.0, jitter=1.0).delay_after(1, "x")
    assert 0.0 <= d <= 10.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": 101},
        {"delay": -1.0},
        {"max_delay": -1.0},
        {"jitter": 1.5},
        {"jitter": -0.1},
        {"backoff": "random"},
    ],
)
def test_invalid_policy_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_attempt_is_one_based() -> None:
    with pytest.raises(ValueError):
        RetryPolicy().delay_after(0, "x")
