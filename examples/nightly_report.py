r"""A nightly report, started by a schedule: the ``nightly-report`` workflow.

Gathers the day's figures, renders a report and "publishes" it (simulated, in-process).
Load it in a worker (``treadle worker --handlers examples.nightly_report``, or add it to
``treadle dev --handlers``) and schedule it every night at 02:30 Berlin time::

    treadle schedules create nightly-report nightly-report \\
        --cron "30 2 * * *" --tz Europe/Berlin --overlap skip --catchup-window 3600 \\
        --jitter 60 --input '{"region": "eu"}'
    treadle schedules get SCHEDULE_ID --next 5      # the next five fire times
    treadle schedules trigger SCHEDULE_ID           # run it once now

Or run ``python -m examples.nightly_report`` against a running API: it creates (or finds)
the schedule and prints its next fire times.

Why these options: ``skip`` because two reports for one night are useless; a one-hour
catch-up window so a deploy at 02:30 still gets its report, while a week-long outage does
not produce seven; jitter spreads many tenants' 02:30 reports over a minute. On the night
clocks go forward in March, 02:30 does not exist in Berlin: the report runs at 03:00; in
October 02:30 happens twice and the report runs once, at the first.
"""

from __future__ import annotations

import os
import sys

import httpx
from pydantic import BaseModel, Field

from app.sdk import WorkflowContext, workflow

PUBLISHED: list[str] = []


class ReportRequest(BaseModel):
    """Input of ``nightly-report``."""

    region: str = Field(default="eu", min_length=1, max_length=32)


class Figures(BaseModel):
    """The day's numbers (simulated)."""

    orders: int
    revenue_cents: int


def gather(region: str, day: str) -> dict[str, int]:
    """Query the day's figures (simulated: derived from region and day)."""
    seed = sum(map(ord, region + day))
    return {"orders": 100 + seed % 50, "revenue_cents": 250_000 + seed * 37}


def render(region: str, day: str, figures: dict[str, int]) -> str:
    """Render the report text."""
    f = Figures.model_validate(figures)
    return f"{region} {day}: {f.orders} orders, {f.revenue_cents / 100:.2f} EUR"


def publish(text: str) -> str:
    """Publish the report (simulated: kept in this process)."""
    PUBLISHED.append(text)
    return f"published {len(text)} characters"


@workflow("nightly-report")
async def nightly_report(ctx: WorkflowContext, req: ReportRequest) -> dict[str, str]:
    """Gather, render and publish yesterday's report for one region."""
    day = (await ctx.now()).date().isoformat()
    figures = await ctx.step(gather, req.region, day)
    text = await ctx.step(render, req.region, day, figures)
    receipt = await ctx.step(publish, text)
    return {"report": text, "receipt": receipt}


def main() -> None:
    """Create the nightly schedule through the API (idempotent by name) and show it."""
    url = os.environ.get("TREADLE_URL", "http://127.0.0.1:8000")
    token = os.environ.get("TREADLE_TOKEN")
    if not token:
        sys.exit("set TREADLE_TOKEN (dev: `treadle token`)")
    body = {
        "name": "nightly-report-eu",
        "workflow": "nightly-report",
        "input": {"region": "eu"},
        "cron": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "overlap": "skip",
        "catchup_window_seconds": 3600,
        "jitter_seconds": 60,
    }
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
        resp = c.post("/schedules", json=body)
        if resp.status_code == 409:
            found = c.get("/schedules", params={"workflow": "nightly-report"}).json()["items"]
            resp = c.get(f"/schedules/{found[0]['schedule_id']}")
        resp.raise_for_status()
        schedule = resp.json()
    print(f"schedule {schedule['schedule_id']} ({schedule['cron']} {schedule['timezone']})")
    for upcoming in schedule["next_fire_times"]:
        print(f"  tick {upcoming['tick']}  fires {upcoming['fire_at']}")


if __name__ == "__main__":
    main()
