"""One log pipeline: structlog's lines and every stdlib logger's, JSON or readable.

Each test configures logging onto its own stream (tests/conftest.py puts the global
state back), logs through structlog and through the stdlib loggers Treadle's processes
carry (alembic, uvicorn, asyncio, sqlalchemy, ``warnings``), and reads every line back.
"""

from __future__ import annotations

import io
import json
import logging
import warnings
from typing import Any

import pytest
import structlog
from pydantic import ValidationError

from app.api.server import server_config
from app.core.logging import DEBUG_ONLY_LOGGERS, STEP_LOGGER, configure_logging
from app.core.settings import LogFormat, Settings

FOREIGN = ("alembic.runtime.migration", "uvicorn.error", "asyncio", "sqlalchemy.engine.Engine")
# A line break that would start a forged record, ESC (drives the terminal), an RTL
# override (reverses what a reader sees), a lone surrogate and a line separator.
HOSTILE = 'paid\n2026-01-01 [info] forged record {"event": "forged"}\x1b[2J\u202eevil\ud800\u2028'


def _configure(log_format: LogFormat, **settings: Any) -> io.StringIO:
    stream = io.StringIO()
    configure_logging(Settings(log_format=log_format, **settings), stream=stream)
    return stream


def _json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    # Every line one JSON object: json.loads raises on anything else.
    lines = stream.getvalue().splitlines()
    assert lines, "nothing was logged"
    return [json.loads(line) for line in lines]


def test_json_every_logger_structlog_and_stdlib_gives_one_object_per_line() -> None:
    stream = _configure(LogFormat.JSON)
    structlog.contextvars.bind_contextvars(run_id="r-1")
    structlog.get_logger("treadle.test").info("from structlog", n=1)
    for name in FOREIGN:
        logging.getLogger(name).warning("from %s", name)
    try:
        raise RuntimeError("inner")
    except RuntimeError:
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
    records = _json_lines(stream)
    by_event = {r["event"]: r for r in records}
    assert by_event["from structlog"]["logger"] == "treadle.test"
    assert by_event["from structlog"]["n"] == 1
    for name in FOREIGN:
        record = by_event[f"from {name}"]
        assert record["logger"] == name
        assert record["level"] == "warning"
        # Context bound to the task reaches stdlib records too (a step's own library).
        assert record["run_id"] == "r-1"
        assert record["timestamp"].endswith("Z")
    crashed = by_event["Task exception was never retrieved"]
    assert crashed["level"] == "error"
    assert "RuntimeError: inner" in crashed["exception"]
    warned = next(r for r in records if r["logger"] == "py.warnings")
    assert "deprecated thing" in warned["event"]
    assert len(records) == len(FOREIGN) + 3


def test_json_hostile_text_stays_inside_its_own_line_and_round_trips() -> None:
    stream = _configure(LogFormat.JSON)
    structlog.get_logger("treadle.test").info(HOSTILE, error=HOSTILE, **{HOSTILE: 1})
    logging.getLogger("uvicorn.error").warning("%s", HOSTILE)
    text = stream.getvalue()
    assert text.isascii()  # ensure_ascii: no raw control, format or surrogate character
    records = _json_lines(stream)
    assert len(records) == 2
    assert records[0]["event"] == HOSTILE
    assert records[0]["error"] == HOSTILE
    assert records[0][HOSTILE] == 1
    assert records[1]["event"] == HOSTILE
    assert "forged" not in {r.get("event") for r in records}


def test_console_hostile_text_cannot_forge_a_record_or_drive_the_terminal() -> None:
    stream = _configure(LogFormat.CONSOLE)
    structlog.get_logger("treadle.test").info(HOSTILE, error=HOSTILE, **{HOSTILE: 1})
    logging.getLogger("alembic.runtime.migration").warning("%s", HOSTILE)
    text = stream.getvalue()
    lines = text.splitlines()
    assert len(lines) == 2, lines
    for bad in ("\x1b", "\u202e", "\u2028", "\ud800"):
        assert bad not in text
    assert "\\u001b[2J" in lines[0] and "\\u202eevil" in lines[0]
    assert "alembic.runtime.migration" in lines[1] and "\\u000a" in lines[1]
    text.encode("utf-8")  # a lone surrogate would make this raise


def test_console_traceback_keeps_its_line_breaks() -> None:
    stream = _configure(LogFormat.CONSOLE)
    try:
        raise ValueError("bad\x1b[31m")
    except ValueError:
        structlog.get_logger("treadle.test").exception("crashed")
    text = stream.getvalue()
    assert "Traceback (most recent call last)" in text
    assert len(text.splitlines()) > 2
    assert "\x1b" not in text


@pytest.mark.parametrize("name", DEBUG_ONLY_LOGGERS)
def test_library_start_up_chatter_shows_only_at_debug(name: str) -> None:
    normal = _configure(LogFormat.JSON, log_level="info")
    logging.getLogger(name).info("setup plugin alembic.autogenerate.schemas")
    logging.getLogger(name).warning("plugin failed")
    logging.getLogger("alembic.runtime.migration").info("Running upgrade")
    assert [r["event"] for r in _json_lines(normal)] == ["plugin failed", "Running upgrade"]

    structlog.reset_defaults()
    asked = _configure(LogFormat.JSON, log_level="debug")
    logging.getLogger(name).info("setup plugin alembic.autogenerate.schemas")
    assert [r["event"] for r in _json_lines(asked)] == ["setup plugin alembic.autogenerate.schemas"]


def test_step_lines_have_their_own_level() -> None:
    quiet_steps = _configure(LogFormat.JSON, step_log_level="warning")
    structlog.get_logger(STEP_LOGGER).info("step started")
    structlog.get_logger("treadle.run").info("run finished")
    assert [r["event"] for r in _json_lines(quiet_steps)] == ["run finished"]

    structlog.reset_defaults()
    loud_steps = _configure(LogFormat.JSON, log_level="warning", step_log_level="debug")
    structlog.get_logger(STEP_LOGGER).debug("step started")
    structlog.get_logger("treadle.run").info("run finished")
    logging.getLogger("alembic").info("Context impl")
    assert [r["event"] for r in _json_lines(loud_steps)] == ["step started"]

    structlog.reset_defaults()
    # Unset, the step level follows TREADLE_LOG_LEVEL: a quiet process is quiet throughout.
    quiet = _configure(LogFormat.JSON, log_level="warning")
    structlog.get_logger(STEP_LOGGER).info("step started")
    structlog.get_logger("treadle.run").warning("lease lost")
    assert [r["event"] for r in _json_lines(quiet)] == ["lease lost"]


@pytest.mark.parametrize("field", ["log_level", "step_log_level"])
def test_an_unknown_level_is_refused_by_name(field: str) -> None:
    with pytest.raises(ValidationError, match="not a log level: 'verbose'"):
        Settings.model_validate({field: "verbose"})


def test_uvicorn_config_installs_no_handlers_of_its_own() -> None:
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    stream = _configure(LogFormat.JSON)
    settings = Settings(database_url="sqlite+aiosqlite:///:memory:")
    config = server_config(object(), settings, graceful_shutdown_seconds=1)
    assert config.log_config is None
    for name in ("uvicorn", "uvicorn.error"):
        assert logging.getLogger(name).handlers == []
        assert logging.getLogger(name).propagate
    logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.")
    assert _json_lines(stream)[-1]["logger"] == "uvicorn.error"


def test_loggers_configured_earlier_in_the_process_join_the_pipeline() -> None:
    # uvicorn served with its defaults (a test's OIDC provider, an embedding application)
    # runs its LOGGING_CONFIG: own handlers on uvicorn.error and uvicorn.access,
    # propagation off. A library may add a StreamHandler of its own. Both printed past
    # the pipeline, in another format, until configure_logging took them over.
    import logging.config

    from uvicorn.config import LOGGING_CONFIG

    logging.config.dictConfig(LOGGING_CONFIG)
    library = logging.getLogger("some.library")
    library.addHandler(logging.StreamHandler(io.StringIO()))
    library.propagate = False
    stream = _configure(LogFormat.JSON)
    for name in ("uvicorn.error", "uvicorn.access", "some.library"):
        logging.getLogger(name).warning("from %s", name)
    by_event = {r["event"]: r for r in _json_lines(stream)}
    for name in ("uvicorn.error", "uvicorn.access", "some.library"):
        assert by_event[f"from {name}"]["logger"] == name
        assert logging.getLogger(name).handlers == []
