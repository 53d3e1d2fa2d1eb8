"""Structured logging: one event name plus fields, as text for people or JSON lines for scripts.

Library code calls :func:`log_event` (and :func:`log_exception` for failures); only the command
line decides the format with :func:`configure_logging`. Nothing in the library prints.

Logs are bounded, because what peers send ends up in them: every field passes :func:`bound`
(strings cut to :data:`MAX_CHARS`, lists and dicts to :data:`MAX_ITEMS`, nesting to
:data:`MAX_DEPTH`, each cut marked with how much was left out), tracebacks are cut to
:data:`MAX_TRACEBACK_CHARS`, and events that can repeat at a peer's pace go through a
:class:`Throttle` (one line per key and interval; the next line says how many were left out).
py-libp2p's own records are routed through the same handler, bounded and throttled per call site.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final, Literal

__all__ = [
    "MAX_CHARS",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_TRACEBACK_CHARS",
    "Throttle",
    "bound",
    "configure_logging",
    "library_teardown",
    "log_event",
    "log_exception",
]

MAX_CHARS: Final = 200
"""Longest string a log field keeps; the rest becomes a ``…[+N chars]`` marker."""
MAX_ITEMS: Final = 20
"""Most items a logged list, tuple, set or dict keeps; the rest becomes a ``…[+N items]`` marker."""
MAX_DEPTH: Final = 4
"""Deepest nesting a logged value keeps; deeper containers become a one-line description."""
MAX_TRACEBACK_CHARS: Final = 4000
"""Longest traceback a record keeps (its end, where the error is)."""
THROTTLE_INTERVAL: Final = 60.0
"""Default seconds between two lines of one throttled key."""

_FIELDS_ATTR = "companion_fields"
_EVENT_ATTR = "companion_event"
_LIBP2P_EVENT = "libp2p"
_ROUTINE: list[Callable[[logging.LogRecord], bool]] = []
"""Predicates over a library's records that mean nothing at the default levels (they show at
DEBUG), added by the code that knows the library (:func:`add_routine`)."""


def add_routine(predicate: Callable[[logging.LogRecord], bool]) -> None:
    """Say that the library records ``predicate`` accepts are routine: left out unless the
    ``libp2p`` logger is at DEBUG. The py-libp2p ones are :mod:`companion.node.logfilters`."""
    if predicate not in _ROUTINE:
        _ROUTINE.append(predicate)


def _bound_str(text: str, max_chars: int) -> str:
    if len(text) > max_chars:
        text = f"{text[:max_chars]}…[+{len(text) - max_chars} chars]"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be written to a UTF-8 stream
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def bound(
    value: Any, *, max_chars: int = MAX_CHARS, max_items: int = MAX_ITEMS, depth: int = MAX_DEPTH
) -> Any:
    """A copy of ``value`` that is safe to log: JSON-like, every string at most ``max_chars``,
    every container at most ``max_items``, nested at most ``depth`` deep, each cut marked.

    Numbers, booleans and ``None`` pass unchanged; bytes are shown as a bounded ``repr``; other
    objects as their bounded ``str``. Never raises for ordinary values."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return _bound_str(value, max_chars)
    if isinstance(value, bytes | bytearray | memoryview):
        return _bound_str(repr(bytes(value[: max_chars + 1])), max_chars)
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        if depth <= 0:
            return f"…[{type(value).__name__} of {len(value)} items]"
        inner = {"max_chars": max_chars, "max_items": max_items, "depth": depth - 1}
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for n, (key, item) in enumerate(value.items()):
                if n == max_items:
                    out["…"] = f"+{len(value) - max_items} items"
                    break
                out[_bound_str(str(key), max_chars)] = bound(item, **inner)
            return out
        items = list(value)[: max_items + 1] if isinstance(value, set | frozenset) else value[: max_items + 1]
        kept = [bound(item, **inner) for item in items[:max_items]]
        if len(value) > max_items:
            kept.append(f"…[+{len(value) - max_items} items]")
        return kept
    try:
        text = str(value)
    except Exception as exc:  # a broken __str__ must not break logging
        text = f"<unprintable {type(value).__name__}: {type(exc).__name__}>"
    return _bound_str(text, max_chars)


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event: ``event`` is a stable snake_case name, ``fields`` its data
    (each bounded with :func:`bound`)."""
    if not logger.isEnabledFor(level):
        return
    bounded = {key: bound(value) for key, value in fields.items()}
    logger.log(level, event, extra={_EVENT_ATTR: event, _FIELDS_ATTR: bounded})


class Throttle:
    """At most one line per key per ``interval`` seconds; the rest are counted.

    :meth:`admit` says whether to log now and how many were left out since the last line, so
    a flood of the same event costs one line a minute that carries the count (the summary)."""

    def __init__(
        self,
        interval: float = THROTTLE_INTERVAL,
        *,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self._max_keys = max_keys
        self._clock = clock
        self._last: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()

    def admit(self, key: Hashable) -> int | None:
        """``None``: leave this one out (counted). Otherwise log it now, saying that the
        returned number of lines of this key were left out since the last one."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval:
            self._last[key] = (last[0], last[1] + 1)
            return None
        self._last[key] = (now, 0)
        self._last.move_to_end(key)
        while len(self._last) > self._max_keys:
            self._last.popitem(last=False)
        return last[1] if last is not None else 0

    def __len__(self) -> int:
        """Keys remembered (at most ``max_keys``)."""
        return len(self._last)

    def suppressed(self) -> int:
        """Lines left out and not yet reported by a later line of their key."""
        return sum(count for _, count in self._last.values())


_EXCEPTIONS = Throttle()


def log_exception(
    logger: logging.Logger,
    event: str,
    exc: BaseException,
    *,
    throttle: Throttle | None = None,
    **fields: Any,
) -> None:
    """Log a failure with its (bounded) traceback, at most once a minute per event, exception
    type and the line that raised it; the next line carries ``suppressed_since_last``."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    chosen = throttle if throttle is not None else _EXCEPTIONS
    left_out = chosen.admit((logger.name, event, type(exc).__name__, where))
    if left_out is None or not logger.isEnabledFor(logging.ERROR):
        return
    bounded = {key: bound(value) for key, value in fields.items()}
    bounded.update(error=bound(repr(exc)), suppressed_since_last=left_out)
    logger.error(event, exc_info=exc, extra={_EVENT_ATTR: event, _FIELDS_ATTR: bounded})


def _traceback(formatter: logging.Formatter, record: logging.LogRecord) -> str:
    text = formatter.formatException(record.exc_info) if record.exc_info else ""
    if len(text) > MAX_TRACEBACK_CHARS:
        text = f"…[{len(text) - MAX_TRACEBACK_CHARS} chars cut]\n{text[-MAX_TRACEBACK_CHARS:]}"
    return text


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: ``{"ts", "level", "logger", "event", ...fields}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, _EVENT_ATTR, None) or bound(record.getMessage()),
        }
        out.update(getattr(record, _FIELDS_ATTR, {}))
        if record.exc_info:
            out["traceback"] = _traceback(self, record)
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level event key=value ...`` for people."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        event = getattr(record, _EVENT_ATTR, None) or bound(record.getMessage())
        fields = getattr(record, _FIELDS_ATTR, {})
        parts = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in fields.items())
        line = f"{stamp} {record.levelname.lower():7} {event} {parts}".rstrip()
        if record.exc_info:
            line += "\n" + _traceback(self, record)
        return line


class LibraryRecords(logging.Filter):
    """Makes py-libp2p's records structured, bounded and throttled per call site: the event
    ``libp2p`` with the bounded ``message`` and ``suppressed_since_last``."""

    def __init__(self, throttle: Throttle | None = None) -> None:
        super().__init__()
        self.throttle = throttle if throttle is not None else Throttle()
        self.teardown = False
        """Set by :func:`library_teardown`: the process is stopping."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _EVENT_ATTR, None) is not None:
            return True
        routine = self.teardown or any(predicate(record) for predicate in _ROUTINE)
        if routine and not logging.getLogger("libp2p").isEnabledFor(logging.DEBUG):
            return False
        left_out = self.throttle.admit((record.name, record.pathname, record.lineno))
        if left_out is None:
            return False
        try:
            message = record.getMessage()
        except Exception as exc:  # a bad format string in the library
            message = f"{record.msg!r} ({type(exc).__name__})"
        setattr(record, _EVENT_ATTR, _LIBP2P_EVENT)
        setattr(record, _FIELDS_ATTR, {"message": bound(message), "suppressed_since_last": left_out})
        return True


def library_teardown() -> None:
    """The process is stopping (SIGINT, SIGTERM; the demo once its conversation ended): from now
    on py-libp2p's records are left out at the default levels, as the routine ones are (libp2p
    at DEBUG still shows them). Its
    connections close mid-handshake, its streams mid-negotiation, and its peers stop too, and
    py-libp2p logs each of those at ERROR: stopping 30 companions together printed 44 such lines
    (handshakes, negotiations, "add_conn failed ... Cancelled"), none of them about a fault.
    The nodes' own events (``stopping``, ``host_close_timeout``, ``stopped``) still show."""
    for handler in logging.getLogger("libp2p").handlers:
        for each in handler.filters:
            if isinstance(each, LibraryRecords):
                each.teardown = True


def configure_logging(
    level: int | str = logging.INFO,
    fmt: Literal["text", "json"] = "text",
    stream: Any = None,
    *,
    libp2p_level: int | str = logging.WARNING,
) -> None:
    """Send the ``companion`` loggers to stderr (or ``stream``), and py-libp2p's records at
    ``libp2p_level`` and above through the same handler, bounded and throttled (py-libp2p would
    otherwise print multi-line errors through Python's last-resort handler).

    py-libp2p 0.8.1's package ``__init__`` clears the handlers of its ``libp2p`` logger when it
    is first imported: a process that runs nodes calls
    :func:`companion.app.logs.configure_node_logging`, which imports it first."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("companion")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    library = logging.StreamHandler(stream or sys.stderr)
    library.setFormatter(handler.formatter)
    library.addFilter(LibraryRecords())
    library.setLevel(libp2p_level)  # some py-libp2p modules set their own loggers' levels
    libp2p_logger = logging.getLogger("libp2p")
    libp2p_logger.handlers[:] = [library]
    libp2p_logger.setLevel(libp2p_level)
    libp2p_logger.propagate = False
