"""``TREADLE_STEP_RESULT_HOLD_SECONDS`` (docs/adr/0047-held-step-results.md): its bounds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.settings import Settings


@pytest.mark.parametrize(("text", "value"), [("0", 0.0), ("0.02", 0.02), ("1", 1.0)])
def test_the_hold_accepts_0_to_1_second(
    monkeypatch: pytest.MonkeyPatch, text: str, value: float
) -> None:
    monkeypatch.setenv("TREADLE_STEP_RESULT_HOLD_SECONDS", text)
    assert Settings().step_result_hold_seconds == value


@pytest.mark.parametrize("text", ["-0.01", "1.5", "nan", "inf", "soon", ""])
def test_the_hold_refuses_what_is_not_0_to_1_second(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("TREADLE_STEP_RESULT_HOLD_SECONDS", text)
    with pytest.raises(ValidationError, match="step_result_hold_seconds"):
        Settings()


def test_the_default_holds_twenty_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TREADLE_STEP_RESULT_HOLD_SECONDS", raising=False)
    assert Settings().step_result_hold_seconds == 0.02
