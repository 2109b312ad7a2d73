"""The query parameters of the console's pages, declared once per page and validated.

A page takes its query string as a model (``q: Annotated[RunsQuery, Query()]``), so the
rules are the API's own, applied the same way (docs/console.md, "Errors of the request
itself"):

- each parameter's type and bounds are checked by FastAPI: a wrong one (``?limit=abc``,
  ``?limit=0``, ``?status=bogus``, a value over its length) is a ``422 invalid_request``
  page listing each field, and nothing is fetched;
- text parameters follow :func:`app.core.text.text_problem` (no control or bidi
  characters: NUL, U+202E …), the rule of the API's text fields;
- a parameter given twice (``?status=a&status=b``) is refused with 422 by the API's
  ``refuse_repeated_query`` (``app.api.query_params``), which ``create_app`` includes
  with the console's routers: which parameters take one value is read from these
  models, as for the API's operations;
- an empty value (``?status=``, what a filter form sends for "any") means unset;
- a page token the API refuses is not an error of the request: the list shows its first
  page under an alert (``app.console.web.first_page_if_stale``).

Unknown parameters are ignored, as the API ignores them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from app.core.status import RunReason, RunStatus
from app.core.text import checked_text

MAX_PAGE_SIZE = 200
"""The largest ``?limit=`` of a console list (the API's list endpoints' own bound)."""


def _blank_is_unset(value: Any) -> Any:
    # A filter form sends every field; "" is the "any" choice, not a value to check.
    return None if value == "" else value


_Checked = AfterValidator(checked_text)
Text40 = Annotated[str, Field(max_length=40), _Checked]
Text64 = Annotated[str, Field(max_length=64), _Checked]
Text100 = Annotated[str, Field(max_length=100), _Checked]
Text200 = Annotated[str, Field(max_length=200), _Checked]
Text255 = Annotated[str, Field(max_length=255), _Checked]
Text2000 = Annotated[str, Field(max_length=2000), _Checked]
PageToken = Annotated[str, Field(max_length=1000), _Checked]
PageSize = Annotated[
    Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE)] | None, BeforeValidator(_blank_is_unset)
]


class _Query(BaseModel):
    # Extra parameters are ignored (as the API's operations ignore them).
    model_config = ConfigDict(extra="ignore")


class PagedQuery(_Query):
    """The paging of every console list: the API's ``page_token`` and a page size."""

    page_token: PageToken = ""
    limit: PageSize = None


class RunsQuery(PagedQuery):
    """``/ui/runs`` and its live table: the Runs page's filters (docs/console.md)."""

    workflow: Text200 = ""
    status: Annotated[RunStatus | None, BeforeValidator(_blank_is_unset)] = None
    created_after: Text40 = ""
    created_before: Text40 = ""
    version: Text64 = ""
    reason: Annotated[RunReason | None, BeforeValidator(_blank_is_unset)] = None
    finished_after: Text40 = ""
    finished_before: Text40 = ""
    label: Text2000 = ""
    q: Text255 = ""


class DeadLettersQuery(PagedQuery):
    """``/ui/dead-letters``: ``status`` (``pending``, the default, or ``all``), workflow."""

    status: Annotated[Literal["pending", "all"] | None, BeforeValidator(_blank_is_unset)] = None
    workflow: Text200 = ""


class SchedulesQuery(PagedQuery):
    """``/ui/schedules``: ``state`` (active, paused, completed; unset: all), workflow."""

    state: Annotated[
        Literal["active", "paused", "completed"] | None, BeforeValidator(_blank_is_unset)
    ] = None
    workflow: Text200 = ""


class StartFormQuery(_Query):
    """``/ui/workflows/{name}/start``: ``version`` pins one (unset: the newest)."""

    version: Text100 = ""
