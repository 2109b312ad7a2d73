"""Structured logging (structlog): JSON in production, readable in a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from app.core.settings import LogFormat, Settings
from app.core.text import printable


def _printable_values(
    logger: Any, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    # A traceback keeps its line breaks (they are its layout, not a value's).
    return {
        key: printable(value, keep="\n" if key == "exception" else "")
        if isinstance(value, str)
        else value
        for key, value in event.items()
    }


def configure_logging(settings: Settings) -> None:
    """Route structlog and stdlib logging to stderr in the configured format.

    Records carry bound context (run id, step id, workflow, worker id) as fields.
    """
    level = logging.getLevelNamesMapping().get(settings.log_level.upper(), logging.INFO)
    # JSON escapes every string itself (ASCII); the console has no escapes, so values are
    # made printable first: a message holding a line break, ESC or an RTL override can
    # neither forge a record nor drive the terminal.
    readable: list[structlog.typing.Processor] = (
        []
        if settings.log_format == LogFormat.JSON
        else [_printable_values, structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *(readable or [structlog.processors.JSONRenderer()]),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
