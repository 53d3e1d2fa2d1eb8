"""How a command's failure becomes its exit status: 2 for a refusal the user can fix (printed as
one line), 1 for anything else (logged with its traceback), 130 for Ctrl-C; and
:func:`command_status`, which runs a long-running command under trio and gives its status."""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable

import trio

from companion.app.stopping import exit_status, is_interrupt
from companion.tasks import innermost

__all__ = ["command_status", "failure_status"]


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


def command_status(
    command: str,
    run: Callable[[], Awaitable[object]],
    logger: logging.Logger,
    refusals: tuple[type[BaseException], ...] = (ValueError, OSError),
    *,
    said: Callable[[BaseException], bool] = lambda exc: False,
) -> int:
    """``companion COMMAND``'s exit status once ``trio.run(run)`` is over: 0 when it returns; an
    interrupt's own (130 after Ctrl-C, 128 + a second signal's number: ``exit_status``); else
    :func:`failure_status` with ``refusals`` and ``said``. What is neither an interrupt nor an
    ``Exception`` goes on up."""
    try:
        trio.run(run)
    except BaseException as exc:
        if is_interrupt(exc):
            return exit_status(exc)
        if not isinstance(exc, Exception):
            raise
        return failure_status(command, exc, logger, refusals, said=said)
    return 0
