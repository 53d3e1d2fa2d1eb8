"""What ``companion listen`` writes to its standard output, as text: lines, and one status line.

In a terminal the status line (``Juniper is thinking… (12 s)``) is redrawn in place: each
update returns to the start of the line, clears it and writes the new text in one write, and
a line printed meanwhile takes the status line's place and the status is drawn again below
it. Redirected to a file or a pipe there is no "in place", so the status becomes an ordinary
line when it appears and then at most every few seconds, and the log stays readable.

Companions' text is network input: control characters (an ESC would drive the terminal) are
removed from every line before it is written; newlines and tabs in messages stay.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Final

from .core import Show

__all__ = ["STATUS_EVERY", "TerminalScreen"]

STATUS_EVERY: Final = 5.0
"""Not a terminal: how often an unchanged status is written again, in seconds."""

STYLES: Final = {
    "message": "",
    "action": "\033[36m",
    "query": "\033[35m",
    "info": "\033[2m",
    "error": "\033[31m",
    "prompt": "\033[33;1m",
    "status": "\033[2m",
}
RESET: Final = "\033[0m"
CLEAR_LINE: Final = "\r\033[K"

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` without terminal control characters (newlines and tabs kept)."""
    return _SURROGATE.sub("\ufffd", _CONTROL.sub("", text))


class TerminalScreen:
    """Turns :class:`Show` effects into the text to write. ``live``: standard output is a
    terminal (redraw the status line in place); ``width``: the terminal's columns, read at each
    draw (a status line longer than the terminal would wrap, and then cannot be replaced)."""

    def __init__(
        self,
        *,
        live: bool,
        color: bool,
        width: Callable[[], int] = lambda: 80,
        clock: Callable[[], float] = time.monotonic,
        status_every: float = STATUS_EVERY,
    ) -> None:
        self.live = live
        self.color = color
        self.width = width
        self.clock = clock
        self.status_every = status_every
        self.status = ""
        self._drawn = False
        self._status_written_at: float | None = None

    def render(self, item: Show) -> str:
        if item.kind == "status":
            return self._status_update(printable(item.text))
        line = self._styled(printable(item.text), item.kind) + "\n"
        if not self.live:
            return line
        if not self._drawn:
            return line
        return CLEAR_LINE + line + self._draw()

    def close(self) -> str:
        """What to write before the program exits: the status line cleared away."""
        drawn, self._drawn = self._drawn, False
        self.status = ""
        return CLEAR_LINE if drawn else ""

    def _status_update(self, text: str) -> str:
        self.status = text
        if self.live:
            if not text:
                drawn, self._drawn = self._drawn, False
                return CLEAR_LINE if drawn else ""
            return CLEAR_LINE + self._draw()
        if not text:
            self._status_written_at = None
            return ""
        now = self.clock()
        last = self._status_written_at
        # a little slack: the ticks that change the text come once a second, not on the dot
        if last is not None and now - last < self.status_every - 0.5:
            return ""
        self._status_written_at = now
        return self._styled(text, "status") + "\n"

    def _draw(self) -> str:
        if not self.status:
            self._drawn = False
            return ""
        self._drawn = True
        room = max(self.width() - 1, 10)
        text = self.status if len(self.status) <= room else self.status[: room - 1] + "…"
        return self._styled(text, "status")

    def _styled(self, text: str, kind: str) -> str:
        style = STYLES.get(kind, "") if self.color else ""
        return f"{style}{text}{RESET}" if style else text
