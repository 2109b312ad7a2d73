"""tests/integration/test_run_views.py again, its lists and reports served by the standby.

The same tests, on a database of the streaming pair (tests/replica/conftest.py) with
``TREADLE_READ_DATABASE_URL`` set: steps, events, counts and reports read through
:meth:`Database.lagging_read` come from the standby. The database commits with
``synchronous_commit = remote_apply``, so each write is applied on the standby before it
returns, and tests written without lag in mind stay deterministic; that a read was the
standby's is checked after each test (replica checkouts made, no fallback). The replica
heartbeat runs meanwhile, as the API runs it (the standby's lag is its age there).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from app.core.settings import Settings
from app.db.database import Database
from tests.conftest import make_settings
from tests.integration.test_run_views import (
    test_admin_cross_tenant_reads_show_the_runs_rows,
    test_branches_cancelled_by_a_failure_or_a_request_say_which,
    test_rejected_approvals_are_failed_steps,
)
from tests.replica.conftest import StreamingPair, heartbeating, sql

pytestmark = pytest.mark.xdist_group("replica")

__all__ = [
    "test_admin_cross_tenant_reads_show_the_runs_rows",
    "test_branches_cancelled_by_a_failure_or_a_request_say_which",
    "test_rejected_approvals_are_failed_steps",
]


@pytest.fixture
def database_url(pair: StreamingPair) -> Iterator[str]:
    """A fresh migrated database on the pair's primary, remote_apply (overrides both dialects)."""
    name = pair.clone(remote_apply=True)
    yield pair.primary.url(name)
    sql(pair.primary.dsn(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def settings(database_url: str, pair: StreamingPair, tmp_path: Path) -> Settings:
    """The test's settings with the standby as the read replica."""
    return make_settings(
        database_url,
        tmp_path,
        read_database_url=database_url.replace(f":{pair.primary.port}/", f":{pair.standby.port}/"),
    )


def _sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(autouse=True)
async def _heartbeat(pair: StreamingPair, db: Database) -> AsyncIterator[None]:
    async with heartbeating(pair, db):
        yield


@pytest.fixture(autouse=True)
def _served_by_the_standby(_heartbeat: None) -> Iterator[None]:
    checkouts = _sample("treadle_db_pool_wait_seconds_count", {"pool": "replica"})
    fallbacks = sum(
        _sample("treadle_db_replica_fallbacks_total", {"reason": r})
        for r in ("unavailable", "lagging")
    )
    yield
    assert _sample("treadle_db_pool_wait_seconds_count", {"pool": "replica"}) > checkouts
    assert (
        sum(
            _sample("treadle_db_replica_fallbacks_total", {"reason": r})
            for r in ("unavailable", "lagging")
        )
        == fallbacks
    )
