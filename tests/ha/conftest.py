"""The Patroni cluster every HA test shares (one etcd, two nodes; tests/ha/cluster.py).

Package-scoped: starting it costs tens of seconds on this machine. Each test begins by
waiting for it to be healthy (a leader and a streaming synchronous standby) and uses its
own database, so the faults one test made are behind the next.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ha.cluster import PatroniCluster, available


@pytest.fixture(scope="package")
def cluster() -> Iterator[PatroniCluster]:
    """One etcd + two Patroni nodes (stopped even when a test fails)."""
    reason = available()
    if reason is not None:
        pytest.skip(reason)
    with PatroniCluster(Path(tempfile.mkdtemp(prefix="treadle-ha-"))) as c:
        yield c
