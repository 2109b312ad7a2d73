"""Outside dev auth mode the console needs TREADLE_CONSOLE_SECRET; the API does not."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from app.cli.ready import console_note
from app.core.settings import AuthMode, Settings
from tests.acceptance.conftest import Stack
from tests.console.conftest import alerts


def test_jwt_mode_without_a_console_secret_serves_a_503_console(
    database_url: str, tmp_path: Path, stack_env: dict[str, str]
) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": []}))
    env = {
        **stack_env,
        "TREADLE_AUTH_MODE": "jwt",
        "TREADLE_JWT_ISSUER": "https://idp.example",
        "TREADLE_JWT_AUDIENCE": "treadle",
        "TREADLE_JWT_JWKS_FILE": str(jwks),
    }
    env.pop("TREADLE_CONSOLE_SECRET", None)
    s = Stack(database_url=database_url, tmp=tmp_path, env=env)
    try:
        s.start_api()
        for path in ("/ui/login", "/ui/runs"):
            page = httpx.get(s.url + path, timeout=30)
            assert page.status_code == 503, (path, page.text[:300])
            assert "TREADLE_CONSOLE_SECRET" in alerts(page.text)[0]
        refused = httpx.post(s.url + "/ui/login", data={"token": "x"}, timeout=30)
        assert refused.status_code == 503
        assert httpx.get(s.url + "/healthz", timeout=30).status_code == 200
        assert httpx.get(s.url + "/runs", timeout=30).status_code == 401  # the API as before
        assert "console off: set TREADLE_CONSOLE_SECRET" in s.logs[0].read_text()
        assert not (Path(env["TREADLE_DATA_DIR"]) / "console-secret").exists()
    finally:
        s.stop()


def test_ready_line_names_the_console() -> None:
    dev = Settings(database_url="sqlite+aiosqlite:///x.db", host="0.0.0.0", port=9000)
    assert console_note(dev) == "console http://0.0.0.0:9000/ui/"
    jwt = Settings(
        database_url="sqlite+aiosqlite:///x.db",
        auth_mode=AuthMode.JWT,
        jwt_issuer="i",
        jwt_audience="a",
        jwt_jwks_url="https://idp.example/jwks",
    )
    assert console_note(jwt) == "console off: set TREADLE_CONSOLE_SECRET"
    assert console_note(jwt.model_copy(update={"console_secret": "k" * 32})).startswith(
        "console http://127.0.0.1:8000/ui/"
    )
