"""Logging set up as the command line sets it up, into a buffer, and put back afterwards: for
tests that read what a run prints."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import companion.node.node  # noqa: F401  (py-libp2p resets its loggers when imported: before any set-up)
from companion.log import configure_logging


@contextmanager
def captured_logs(level: str) -> Iterator[io.StringIO]:
    """``configure_logging(level, "json")`` into the buffer yielded; the ``companion`` and
    ``libp2p`` loggers are restored as they were at the end."""
    saved = [
        (logger, logger.handlers[:], logger.level, logger.propagate)
        for logger in (logging.getLogger("companion"), logging.getLogger("libp2p"))
    ]
    stream = io.StringIO()
    configure_logging(level, "json", stream)
    try:
        yield stream
    finally:
        for logger, handlers, level_was, propagate in saved:
            logger.handlers[:] = handlers
            logger.setLevel(level_was)
            logger.propagate = propagate
