"""How a command's failure becomes its exit status: 2 for a refusal the user can fix (printed as
one line), 1 for anything else (logged with its traceback), 130 for Ctrl-C."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

__all__ = ["failure_status", "innermost"]


def innermost(exc: BaseException) -> BaseException:
    """The one exception inside nested single-exception groups (trio wraps a task's failure)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def failure_status(
    command: str,
    exc: BaseException,
    logger: logging.Logger,
    refusals: tuple[type[BaseException], ...] = (ValueError, OSError),
    *,
    said: Callable[[BaseException], bool] = lambda exc: False,
) -> int:
    """The exit status of ``companion COMMAND`` failing with ``exc`` (not an interrupt: each
    command says what its Ctrl-C returns): 2 for one of ``refusals``, printed as one line on
    standard error unless ``said`` it already, else 1, logged with its traceback as
    ``COMMAND_failed``."""
    exc = innermost(exc)
    if isinstance(exc, refusals):
        if not said(exc):
            print(f"companion {command}: {exc}", file=sys.stderr)
        return 2
    logger.exception(f"{command} failed", extra={"companion_event": f"{command}_failed"})
    return 1
