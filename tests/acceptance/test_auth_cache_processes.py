"""An API key revoked through one ``treadle serve`` reaches another within the cache window.

Two real API processes on one database, over real HTTP. Process B verified the key and
caches it for ``TREADLE_AUTH_CACHE_TTL_SECONDS`` (15 s here); the key is revoked through
process A, which refuses it at once; B still serves it right after (the documented
window, docs/security.md#token-cache) and refuses it once the window is over.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.conftest import Stack, token

TTL = 15.0
SLACK = 30.0  # a loaded machine may be slow to answer, never this slow


@pytest.fixture
def two_apis(
    database_url: str, tmp_path: Path, stack_env: dict[str, str]
) -> Iterator[tuple[Stack, Stack]]:
    env = {**stack_env, "TREADLE_AUTH_CACHE_TTL_SECONDS": str(TTL)}
    a = Stack(database_url=database_url, tmp=tmp_path, env=env)
    b = Stack(database_url=database_url, tmp=tmp_path, env=env)
    try:
        a.start_api()
        b.start_api()
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_revocation_through_another_process_takes_effect_within_the_ttl(
    two_apis: tuple[Stack, Stack],
) -> None:
    a, b = two_apis
    with a.client(token(scopes=["admin"])) as admin:
        created = admin.post("/admin/api-keys", json={"name": "ci", "scopes": ["runs:read"]})
        assert created.status_code == 201, created.text
    key, key_id = created.json()["api_key"], created.json()["key_id"]
    with a.client(key) as on_a, b.client(key) as on_b:
        assert on_a.get("/runs").status_code == 200
        assert on_b.get("/runs").status_code == 200  # B verified it: cached for TTL
        with a.client(token(scopes=["admin"])) as admin:
            assert admin.delete(f"/admin/api-keys/{key_id}").status_code == 200
        revoked_at = time.monotonic()
        assert on_a.get("/runs").status_code == 401  # the revoking process: at once
        # B is inside its window: its cached verification still stands.
        assert on_b.get("/runs").status_code == 200
        assert time.monotonic() - revoked_at < TTL, "too slow to observe the window"
        while (status := on_b.get("/runs").status_code) == 200:
            assert time.monotonic() - revoked_at < TTL + SLACK, "B never refused the key"
            time.sleep(0.2)
        assert status == 401
        # Once refused, refused for good (the refusal is not cached, the DB says revoked).
        assert on_b.get("/runs").status_code == 401
