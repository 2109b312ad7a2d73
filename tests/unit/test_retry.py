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


class CardDeclined(Exception):
    """A payment error the workflow must not retry."""


class ExpiredCard(CardDeclined):
    """A subclass: matched by its base's class or name."""


def test_non_retryable_matches_classes_subclasses_and_names() -> None:
    by_class = RetryPolicy(non_retryable=(CardDeclined,))
    assert by_class.refusal(CardDeclined("no")) == (
        "CardDeclined matches RetryPolicy.non_retryable (CardDeclined)"
    )
    assert by_class.refusal(ExpiredCard("old")) == (
        "ExpiredCard matches RetryPolicy.non_retryable (CardDeclined)"
    )
    assert by_class.refusal(ConnectionError("flap")) is None
    # Names: bare, qualified by the module, or a base's name; a prefix is not a match.
    qualified = f"{__name__}.CardDeclined"
    for name in ("CardDeclined", qualified):
        assert RetryPolicy(non_retryable=(name,)).refusal(ExpiredCard("x")) is not None
    assert RetryPolicy(non_retryable=("Card",)).refusal(CardDeclined("x")) is None
    assert RetryPolicy(non_retryable=("OSError",)).refusal(ConnectionError("x")) is not None
    # The default retries everything (Permanent is the engine's own rule).
    assert RetryPolicy().refusal(CardDeclined("x")) is None


def test_retry_on_retries_only_what_it_names_and_non_retryable_wins() -> None:
    policy = RetryPolicy(retry_on=(ConnectionError, "TimeoutError"))
    assert policy.refusal(ConnectionResetError("reset")) is None  # a subclass
    assert policy.refusal(TimeoutError("slow")) is None
    assert policy.refusal(ValueError("bug")) == (
        "ValueError is not in RetryPolicy.retry_on (ConnectionError, TimeoutError)"
    )
    both = RetryPolicy(retry_on=(Exception,), non_retryable=[CardDeclined])
    assert both.non_retryable == (CardDeclined,)  # a list is kept as a tuple
    assert both.refusal(CardDeclined("x")) is not None
    assert both.refusal(KeyError("x")) is None
    nothing = RetryPolicy(retry_on=())
    assert nothing.refusal(ConnectionError("x")) == (
        "ConnectionError is not in RetryPolicy.retry_on (nothing)"
    )


@pytest.mark.parametrize(
    "entries",
    [(42,), ("",), ("  ",), (int,), (None,), (CardDeclined("an instance"),)],
)
def test_error_entries_must_be_exception_classes_or_names(entries: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="exception classes or class names"):
        RetryPolicy(non_retryable=entries)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exception classes or class names"):
        RetryPolicy(retry_on=entries)  # type: ignore[arg-type]


def test_one_entry_given_bare_is_a_list_of_one() -> None:
    assert RetryPolicy(non_retryable=CardDeclined).non_retryable == (CardDeclined,)  # type: ignore[arg-type]
    assert RetryPolicy(retry_on="CardDeclined").retry_on == ("CardDeclined",)
