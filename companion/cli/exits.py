"""How a command's failure becomes its exit status: 2 for a refusal the user can fix (printed as
one line), 1 for anything else (logged with its traceback), 130 for Ctrl-C."""

from __future__ import annotations

__all__ = ["innermost"]


def innermost(exc: BaseException) -> BaseException:
    """The one exception inside nested single-exception groups (trio wraps a task's failure)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
