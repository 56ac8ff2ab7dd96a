"""Structured logging: structlog, JSON when not a TTY, and a redactor for secrets.

Configured once by the CLI entry or the daemon. The redactor runs after exceptions are
formatted, so a token inside a traceback or an error message is masked too.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

import structlog

MASK = "**********"


class Redactor:
    """A structlog processor that replaces every secret value wherever it appears."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Each secret also as it appears escaped: in a repr, in JSON, in an error quoting a header.
        forms = {form for s in secrets if s for form in (s, repr(s)[1:-1], json.dumps(s)[1:-1])}
        self.secrets = sorted(forms, key=len, reverse=True)

    def __call__(self, _logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        return {key: self.scrub(value) for key, value in event_dict.items()}

    def scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self.secrets:
                value = value.replace(secret, MASK)
            return value
        if isinstance(value, dict):
            return {key: self.scrub(item) for key, item in value.items()}
        if isinstance(value, (list, tuple, set)):
            return type(value)(self.scrub(item) for item in value)
        if isinstance(value, BaseException):
            return self.scrub(repr(value))
        return value


_active = Redactor(())


def redact(text: str) -> str:
    """`text` with the configured secrets masked: for error lines and API answers, not only logs."""
    return _active.scrub(text)


def configure(
    *, secrets: Iterable[str] = (), json: bool | None = None, stream: TextIO | None = None,
    level: int = logging.INFO,
) -> None:
    """Route structlog to `stream` (stderr), JSON unless it is a terminal."""
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    global _active
    _active = Redactor(secrets)
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _active,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
