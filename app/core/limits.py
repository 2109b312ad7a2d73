"""Length limits of free-text fields that both the API and the console enforce.

One constant per limit, so the console refuses (with its own alert) exactly what the API
would refuse with 422, and never cuts a value the API would have taken or stores a value
the user did not type (``docs/api.md`` documents each limit with its field).
"""

from __future__ import annotations

MAX_ACTION_REASON = 1000
"""Characters of an operator's reason (cancel, pause, retry, requeue): ``ActionReason``."""

MAX_APPROVAL_COMMENT = 2000
"""Characters of an approval decision's ``comment``."""

MAX_SIGNAL_NAME = 200
"""Characters of a signal name (``POST /runs/{run_id}/signals/{name}``)."""
