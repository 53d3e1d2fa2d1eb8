"""How a long-running command learns it should stop, and how Ctrl-C reaches its exit status.

SIGINT (Ctrl-C) and SIGTERM stop ``run``, ``bridge`` and ``relay`` cleanly (hosts closed, peers
told); after SIGINT the command raises :class:`Interrupted` once everything has stopped, so the
command line exits with 130 as a shell expects after Ctrl-C, while SIGTERM (a service manager's
stop) exits 0. Trio delivers a Ctrl-C that no signal receiver catches as ``KeyboardInterrupt``
inside nested exception groups; :func:`is_interrupt` recognizes both.
"""

from __future__ import annotations

import logging
import signal

from ..log import library_teardown, log_event

__all__ = ["Interrupted", "is_interrupt", "note_stopping"]


class Interrupted(Exception):
    """SIGINT arrived: the command stopped cleanly and exits with 130."""


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C: :class:`Interrupted`, ``KeyboardInterrupt``, or exception
    groups holding nothing else (trio wraps each task's exception)."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split((KeyboardInterrupt, Interrupted))
        return rest is None
    return isinstance(exc, KeyboardInterrupt | Interrupted)


def note_stopping(logger: logging.Logger, signum: int) -> None:
    """Log ``stopping`` with the signal's name; py-libp2p's records of the teardown that
    follows are left out (:func:`~companion.log.library_teardown`)."""
    log_event(logger, "stopping", signal=signal.Signals(signum).name)
    library_teardown()
