"""Structured logging: one structlog pipeline for every logger, JSON or readable.

structlog's own loggers (``structlog.get_logger``) and every stdlib logger (alembic,
uvicorn, asyncio, sqlalchemy, ``warnings``) end in the same stdlib handler on stderr,
whose :class:`structlog.stdlib.ProcessorFormatter` renders each record with the same
processors: with ``TREADLE_LOG_FORMAT=json`` every line on stderr is one JSON object.
Why one pipeline: docs/adr/0024-one-log-pipeline-and-an-access-log.md.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

from app.core.settings import LogFormat, Settings
from app.core.text import printable

STEP_LOGGER = "treadle.steps"
"""The logger of the per-attempt lines (``step started`` / ``step finished``), whose level
``TREADLE_STEP_LOG_LEVEL`` sets apart from ``TREADLE_LOG_LEVEL`` (see
app/engine/story_log.py)."""


DEBUG_ONLY_LOGGERS = ("alembic.runtime.plugins",)
"""Loggers whose INFO lines show only when ``TREADLE_LOG_LEVEL`` is ``debug``.

Alembic logs one "setup plugin ..." line per autogenerate plugin whenever it loads its
script directory, which every command checking the schema does (``treadle maintenance
...``, ``treadle worker``): noise on an operator's terminal. Alembic's migration lines
(``alembic.runtime.migration``: "Running upgrade ...") stay at the normal level.
"""


def level_number(name: str) -> int:
    """The stdlib level number of a level name (``"info"``, ``"WARNING"``, …).

    Raises:
        ValueError: not a level name Python knows.
    """
    number = logging.getLevelNamesMapping().get(name.upper())
    if number is None:
        known = ", ".join(sorted(logging.getLevelNamesMapping()))
        raise ValueError(f"unknown log level {name!r}: one of {known}")
    return number


def _printable_values(
    logger: Any, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    # A traceback keeps its line breaks (they are its layout, not a value's). Keys too:
    # a stdlib record's or a handler's field name is text like any other.
    return {
        (printable(key) if isinstance(key, str) else key): printable(
            value, keep="\n" if key == "exception" else ""
        )
        if isinstance(value, str)
        else value
        for key, value in event.items()
    }


def _shared_processors() -> list[structlog.typing.Processor]:
    # What every record gets, structlog's or a stdlib logger's (foreign_pre_chain):
    # the context bound to this task (run id, step id, request id), level, logger, time.
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def formatter(log_format: LogFormat, *, colors: bool = False) -> logging.Formatter:
    """The formatter of the stderr handler: one line per record in ``log_format``.

    JSON escapes every string itself (ASCII only, ``ensure_ascii``), so no value can break
    a line. The console has no escapes, so values (and keys) are made printable first: a
    message holding a line break, ESC or an RTL override can neither forge a record nor
    drive the terminal (docs/security.md).

    Args:
        log_format: ``json`` or ``console``.
        colors: ANSI colours in the console format (a terminal).

    Returns:
        A :class:`structlog.stdlib.ProcessorFormatter` for records from structlog and
        from any stdlib logger.
    """
    renderer: list[structlog.typing.Processor] = (
        [structlog.processors.JSONRenderer()]
        if log_format == LogFormat.JSON
        else [_printable_values, structlog.dev.ConsoleRenderer(colors=colors)]
    )
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            *renderer,
        ],
    )


def _route_to_root() -> None:
    # Another configuration run earlier in this process (uvicorn's default dictConfig when
    # an ASGI app is served with uvicorn's defaults, a library's own StreamHandler) leaves
    # loggers with handlers of their own and propagation off: their lines would bypass the
    # pipeline, in another format. Every logger that exists now is routed to the root.
    # Loggers created later start with no handler and propagating, which is the same.
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            for old in list(logger.handlers):
                logger.removeHandler(old)
            logger.propagate = True


def configure_logging(settings: Settings, *, stream: TextIO | None = None) -> None:
    """Route structlog and every stdlib logger to ``stream`` (stderr) in one format.

    Records carry bound context (run id, step id, workflow, worker id, request id) as
    fields. ``TREADLE_LOG_LEVEL`` is the root level; ``TREADLE_STEP_LOG_LEVEL`` (default:
    the same) the level of :data:`STEP_LOGGER` alone; the loggers of
    :data:`DEBUG_ONLY_LOGGERS` show below WARNING only at ``debug``. Replaces the root
    logger's handlers (one handler, so lines written from threads never interleave),
    removes the handlers of every other existing logger and turns their propagation back
    on (a uvicorn default config or a library's own handler would print past the
    pipeline), and routes
    ``warnings`` through logging.

    Raises:
        ValueError: a level setting is not a level name.
    """
    level = level_number(settings.log_level)
    step_level = level_number(settings.step_log_level or settings.log_level)
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter(settings.log_format, colors=out.isatty()))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    _route_to_root()
    root.setLevel(level)
    logging.getLogger(STEP_LOGGER).setLevel(step_level)
    for name in DEBUG_ONLY_LOGGERS:
        # Their INFO lines are a library's start-up chatter, not news for the operator.
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else logging.WARNING)
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            # Per-logger levels (the step logger's) are stdlib's: ask it first, so a line
            # it would drop is not built.
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        # The cheap first gate: below the lowest configured level nothing is built.
        wrapper_class=structlog.make_filtering_bound_logger(min(level, step_level)),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
