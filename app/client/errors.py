"""Errors the client raises: one tree under :class:`app.core.errors.TreadleError`.

Every answer the server did not mean as a success becomes a :class:`TreadleAPIError`
carrying the RFC 9457 problem's ``code``, ``status``, ``title`` and ``detail``
(docs/api.md#problems); a server that cannot be reached is the subclass
:class:`TreadleUnreachable`. A run that *ended* badly is not an API error: ``execute``
raises :class:`RunFailed` with the run's result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.core.errors import TreadleError

if TYPE_CHECKING:
    from app.client.models import RunResult


class TreadleAPIError(TreadleError):
    """The API answered with an error (a problem+json body, or something unexpected).

    Attributes:
        code: the problem's stable ``code`` (e.g. ``run_not_found``); for answers that are
            not problem+json, ``unexpected_response``; for transport failures,
            ``server_unreachable``.
        status: HTTP status (None when no answer came).
        title: the problem's ``title`` (the status phrase).
        detail: human-readable explanation.
        problem: the whole problem body (extra members such as ``errors``,
            ``active_run_id``), empty when there was none.
    """

    def __init__(
        self,
        detail: str,
        *,
        code: str,
        status: int | None,
        title: str = "",
        problem: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        # The problem's members (``data`` of TreadleError): its own name-clashing keys
        # (``detail``, ``status``) must not become keyword arguments.
        self.data = dict(problem or {})
        self.code = code
        self.status = status
        self.title = title
        self.problem: dict[str, Any] = dict(problem or {})

    def __str__(self) -> str:
        """One line: ``<status> <code>: <detail>``."""
        where = f"{self.status} " if self.status is not None else ""
        return f"{where}{self.code}: {self.detail}"


class TreadleUnreachable(TreadleAPIError):
    """No answer: connection refused, DNS failure, timeout or a dropped connection."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, code="server_unreachable", status=None, title="Unreachable")


class InvalidBody(TreadleError, ValueError):
    """A request body JSON cannot carry; raised before anything is sent.

    NaN or Infinity, an object that is not JSON (pydantic models are sent as their JSON
    form), or nesting past Python's recursion limit. Lone surrogates are sent escaped and
    the API refuses them itself (422).
    """

    code = "invalid_body"


class RunFailed(TreadleError):
    """``execute`` waited for a run that ended other than ``completed``.

    Attributes:
        result: the terminal :class:`~app.client.models.RunResult` (status, reason, error).
    """

    code = "run_failed"

    def __init__(self, result: RunResult) -> None:
        reason = result.reason.value if result.reason else "no reason"
        super().__init__(f"run {result.run_id} ended {result.status.value} ({reason})")
        self.result = result


class RunNotFinished(TreadleError):
    """``execute`` gave up waiting: the run is still open after ``timeout`` seconds.

    Attributes:
        result: the last (not done) :class:`~app.client.models.RunResult`.
    """

    code = "run_not_finished"

    def __init__(self, result: RunResult, waited: float) -> None:
        super().__init__(f"run {result.run_id} is still {result.status.value} after {waited:g} s")
        self.result = result
