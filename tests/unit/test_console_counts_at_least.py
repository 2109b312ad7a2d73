"""The console's counts show a capped status and total with a ``+`` (docs/adr/0055)."""

from __future__ import annotations

from app.client import RunCounts
from app.console.runs_page import RunFilters
from app.console.web import templates


def _render(counts: RunCounts) -> str:
    template = templates.env.get_template("_runs_table.html")
    return template.render(counts=counts, filters=RunFilters(), page=None)


def test_capped_counts_read_as_at_least() -> None:
    capped = RunCounts(
        counts={"completed": 1000, "failed": 17, "queued": 0},
        total=1017,
        total_at_least=True,
        at_least=["completed"],
        count_limit=1000,
    )
    html = _render(capped)
    assert "all: 1017+" in html
    assert "1000+" in html
    assert "</span> 17<" in html  # failed: exact


def test_exact_counts_have_no_plus() -> None:
    exact = RunCounts(counts={"completed": 3, "failed": 1}, total=4, count_limit=1000)
    html = _render(exact)
    assert "all: 4<" in html and "+" not in html.split("Counts by status")[1].split("</ul>")[0]
