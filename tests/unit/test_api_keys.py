"""API key format, hashing and the dev-mode rule of ``treadle dev`` / ``token`` / ``serve``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.api.app import create_app
from app.auth import api_keys
from app.cli.main import app
from app.core.errors import AuthModeRequired, InvalidInput
from app.core.settings import AuthMode, Settings
from app.engine.api_keys import parse_scopes
from tests.conftest import DEV_SECRET


def test_generated_keys_parse_and_match_only_themselves() -> None:
    first, second = api_keys.generate(), api_keys.generate()
    assert first.token != second.token and first.prefix != second.prefix
    assert api_keys.is_api_key(first.token)
    assert api_keys.parse_prefix(first.token) == first.prefix
    assert first.secret_hash == hashlib.sha256(first.token.encode()).hexdigest()
    assert api_keys.matches(first.token, first.secret_hash)
    assert not api_keys.matches(second.token, first.secret_hash)
    assert first.token not in first.secret_hash


@pytest.mark.parametrize(
    "bad",
    ["trd_", "trd_zzzzzzzzzzzz_" + "a" * 43, "trd_0123456789ab_short", "eyJhbGciOi.x.y", ""],
)
def test_malformed_keys_have_no_prefix(bad: str) -> None:
    assert api_keys.parse_prefix(bad) is None


def test_scopes_are_validated() -> None:
    assert [s.value for s in parse_scopes(["runs:read", "runs:read", "admin"])] == [
        "runs:read",
        "admin",
    ]
    for bad in (["runs:readx"], []):
        with pytest.raises(InvalidInput):
            parse_scopes(bad)


def _env(tmp_path: Path, url: str, mode: str | None) -> dict[str, str | None]:
    return {
        "TREADLE_DATABASE_URL": url,
        "TREADLE_DATA_DIR": str(tmp_path),
        "TREADLE_DEV_SECRET": DEV_SECRET,
        "TREADLE_AUTH_MODE": mode,
    }


def test_dev_tokens_are_refused_on_postgresql_unless_explicit(tmp_path: Path) -> None:
    runner = CliRunner()
    pg = "postgresql+asyncpg://treadle:hunter2@db.internal/treadle"
    refused = runner.invoke(app, ["token"], env=_env(tmp_path, pg, None))
    assert refused.exit_code == 2
    assert "refusing `treadle token`" in refused.output
    assert "hunter2" not in refused.output
    refused_dev = runner.invoke(app, ["dev"], env=_env(tmp_path, pg, None))
    assert refused_dev.exit_code == 2 and "refusing `treadle dev`" in refused_dev.output

    explicit = runner.invoke(app, ["token"], env=_env(tmp_path, pg, "dev"))
    assert explicit.exit_code == 0, explicit.output
    assert "dev-mode tokens outside the embedded database" in explicit.output
    assert "hunter2" not in explicit.output
    assert explicit.output.strip().splitlines()[-1].startswith("eyJ")

    jwt_mode = runner.invoke(
        app,
        ["token"],
        env={
            **_env(tmp_path, pg, "jwt"),
            "TREADLE_JWT_ISSUER": "https://idp.test/",
            "TREADLE_JWT_AUDIENCE": "treadle",
            "TREADLE_JWT_JWKS_URL": "https://idp.test/jwks",
        },
    )
    assert jwt_mode.exit_code == 2 and "TREADLE_AUTH_MODE is jwt" in jwt_mode.output


def test_dev_tokens_on_sqlite_need_nothing(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'treadle.db'}"
    done = CliRunner().invoke(app, ["token"], env=_env(tmp_path, url, None))
    assert done.exit_code == 0, done.output
    assert "WARNING" not in done.output


def test_serve_and_create_app_refuse_dev_auth_nobody_chose(tmp_path: Path) -> None:
    pg = "postgresql+asyncpg://treadle:hunter2@db.internal/treadle"
    refused = CliRunner().invoke(app, ["serve"], env=_env(tmp_path, pg, None))
    assert refused.exit_code == 2, refused.output
    assert "refusing `treadle serve`" in refused.output
    assert "TREADLE_AUTH_MODE" in refused.output and "hunter2" not in refused.output
    with pytest.raises(AuthModeRequired, match="TREADLE_AUTH_MODE"):
        create_app(Settings(database_url=pg, dev_secret=DEV_SECRET), check_schema_on_start=False)
    # Chosen explicitly, or on the embedded SQLite database, dev auth is allowed.
    for settings in (
        Settings(database_url=pg, dev_secret=DEV_SECRET, auth_mode=AuthMode.DEV),
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", dev_secret=DEV_SECRET),
    ):
        assert settings.dev_auth_refusal() is None
        create_app(settings, check_schema_on_start=False)
