"""Every wait a run can be in has the console's wait style (static/console.css)."""

from __future__ import annotations

import re

from app.console.web import STATIC_DIR
from app.core.status import RunStatus


def test_every_waiting_status_has_the_wait_style() -> None:
    css = (STATIC_DIR / "console.css").read_text()
    rule = next(line for line in css.splitlines() if ".s-waiting_signal" in line)
    styled = set(re.findall(r"\.s-([a-z_]+)", rule.split("{", 1)[0]))
    waits = {s.value for s in RunStatus if s.value.startswith("waiting_")}
    assert waits, "no waiting statuses?"
    assert waits <= styled, f"waiting statuses without the wait style: {sorted(waits - styled)}"
