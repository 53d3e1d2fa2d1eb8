"""Structured logging: one event name plus fields, as text for people or JSON lines for scripts.

Library code calls :func:`log_event`; only the command line decides the format with
:func:`configure_logging`. Nothing in the library prints.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal

__all__ = ["configure_logging", "log_event"]

_FIELDS_ATTR = "companion_fields"
_EVENT_ATTR = "companion_event"


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event: ``event`` is a stable snake_case name, ``fields`` its data."""
    if not logger.isEnabledFor(level):
        return
    logger.log(level, event, extra={_EVENT_ATTR: event, _FIELDS_ATTR: fields})


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: ``{"ts", "level", "logger", "event", ...fields}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, _EVENT_ATTR, record.getMessage()),
        }
        out.update(getattr(record, _FIELDS_ATTR, {}))
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level event key=value ...`` for people."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        event = getattr(record, _EVENT_ATTR, record.getMessage())
        fields = getattr(record, _FIELDS_ATTR, {})
        parts = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in fields.items())
        line = f"{stamp} {record.levelname.lower():7} {event} {parts}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(
    level: int | str = logging.INFO, fmt: Literal["text", "json"] = "text", stream: Any = None
) -> None:
    """Send the ``companion`` loggers to stderr; quiet py-libp2p's multi-line error output."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("companion")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    libp2p_logger = logging.getLogger("libp2p")
    libp2p_logger.handlers[:] = [logging.NullHandler()]
    libp2p_logger.propagate = False
