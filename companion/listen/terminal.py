"""What ``companion listen`` writes to its standard output, as text: lines, one status line,
and, when the person types in the same terminal, the line being typed.

In a terminal the status line (``Juniper is thinking… (12 s)``) is redrawn in place: each
update returns to the start of the line, clears it and writes the new text in one write, and
a line printed meanwhile takes the status line's place and the status is drawn again below
it. With ``prompt`` (standard input is that terminal too) the line being typed is the last
row, below the status: a line that arrives is printed above both and they are drawn again,
so what the person is typing is never cut by what companions say (:class:`LineEditor` keeps
it, the terminal's own echo being off). Redirected to a file or a pipe there is no "in
place", so the status becomes an ordinary line when it appears and then at most every few
seconds, and the log stays readable.

Companions' text is network input: control characters (an ESC would drive the terminal) are
removed from every line before it is written; newlines and tabs in messages stay.
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from companion.listen.core import Show

__all__ = ["MAX_INPUT", "PROMPT", "STATUS_EVERY", "LineEditor", "TerminalScreen", "columns"]

PROMPT: Final = "> "
MAX_INPUT: Final = 4000
"""Characters a typed line may hold (a paste beyond it is cut)."""

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
    "input": "\033[1m",
}
RESET: Final = "\033[0m"
CLEAR_LINE: Final = "\r\033[K"
CURSOR_UP: Final = "\033[A"

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` without terminal control characters (newlines and tabs kept)."""
    return _SURROGATE.sub("\ufffd", _CONTROL.sub("", text))


def columns(text: str) -> int:
    """How many terminal columns ``text`` takes: East Asian wide characters two, combining
    marks none (Japanese lines must not wrap where the code counted one column a character)."""
    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        for ch in text
    )


def _head(text: str, room: int) -> str:
    """``text`` cut to ``room`` columns, with ``…`` when cut."""
    if columns(text) <= room:
        return text
    out, used = [], 0
    for ch in text:
        width = columns(ch)
        if used + width > room - 1:
            break
        out.append(ch)
        used += width
    return "".join(out) + "…"


def _tail(text: str, room: int) -> str:
    """The end of ``text`` that fits ``room`` columns, with ``…`` first when cut (the cursor
    is at the end of what is typed, so that is the part to show)."""
    if columns(text) <= room:
        return text
    out: list[str] = []
    used = 0
    for ch in reversed(text):
        width = columns(ch)
        if used + width > room - 1:
            break
        out.append(ch)
        used += width
    return "…" + "".join(reversed(out))


class TerminalScreen:
    """Turns :class:`Show` effects into the text to write. ``live``: standard output is a
    terminal (redraw the status line in place); ``width``: the terminal's columns, read at each
    draw (a row longer than the terminal would wrap, and then cannot be replaced); ``prompt``:
    the person types in this terminal (draw the typed line last); ``timestamps``: message lines
    start with the time they were said (``wall``: the clock for lines said now)."""

    def __init__(
        self,
        *,
        live: bool,
        color: bool,
        width: Callable[[], int] = lambda: 80,
        clock: Callable[[], float] = time.monotonic,
        status_every: float = STATUS_EVERY,
        prompt: bool = False,
        timestamps: bool = False,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.live = live
        self.color = color
        self.width = width
        self.clock = clock
        self.status_every = status_every
        self.prompt = prompt and live
        self.timestamps = timestamps
        self.wall = wall
        self.status = ""
        self.typed = ""
        self._rows = 0
        """Rows drawn below the last line (status, typed line); the cursor ends the last one."""
        self._status_written_at: float | None = None

    def render(self, item: Show) -> str:
        if item.kind == "status":
            return self._status_update(printable(item.text))
        text = printable(item.text)
        if self.timestamps and item.kind == "message":
            said = item.at if item.at is not None else self.wall()
            text = time.strftime("%H:%M ", time.localtime(said)) + text
        line = self._styled(text, item.kind) + "\n"
        if not self.live:
            return line
        return self._clear() + line + self._draw()

    def edit(self, typed: str) -> str:
        """The line being typed now reads ``typed``: its row drawn again."""
        self.typed = typed
        return self._clear() + self._draw() if self.prompt else ""

    def submitted(self, line: str) -> str:
        """The person pressed Enter on ``line``: it stays above (as the terminal's echo left
        it), and the typed row starts empty."""
        self.typed = ""
        if not self.prompt:
            return ""
        echo = self._styled(PROMPT + printable(line), "input") + "\n" if line.strip() else ""
        return self._clear() + echo + self._draw()

    def close(self) -> str:
        """What to write before the program exits: the status (and typed) rows cleared away."""
        self.status = ""
        self.typed = ""
        return self._clear()

    def _status_update(self, text: str) -> str:
        self.status = text
        if self.live:
            cleared = self._clear()
            return (cleared or (CLEAR_LINE if text else "")) + self._draw()
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

    def _clear(self) -> str:
        rows, self._rows = self._rows, 0
        return CLEAR_LINE + (CURSOR_UP + CLEAR_LINE) * (rows - 1) if rows else ""

    def _draw(self) -> str:
        room = max(self.width() - 1, 10)
        rows = []
        if self.status:
            rows.append(self._styled(_head(self.status, room), "status"))
        if self.prompt:
            rows.append(PROMPT + _tail(printable(self.typed), room - len(PROMPT)))
        self._rows = len(rows)
        return "\n".join(rows)

    def _styled(self, text: str, kind: str) -> str:
        style = STYLES.get(kind, "") if self.color else ""
        return f"{style}{text}{RESET}" if style else text


@dataclass
class LineEditor:
    """The line being typed, from the keys of a terminal whose own echo and line editing are off
    (cbreak mode): printable characters add, Backspace removes the last one, Ctrl-U clears,
    Ctrl-W removes the last word, Enter submits, Ctrl-D on an empty line ends the input; escape
    sequences (arrow keys) and other control characters are dropped. Pure: :meth:`feed` says
    what happened."""

    text: str = ""
    _escape: str | None = None
    submitted: list[str] = field(default_factory=list)
    ended: bool = False

    def feed(self, chars: str) -> bool:
        """Take typed characters; whether :attr:`text` changed. Lines submitted meanwhile are
        appended to :attr:`submitted` (the caller takes them); :attr:`ended` is set by Ctrl-D."""
        before = self.text
        for ch in chars:
            if self._escape is not None:
                self._escape += ch
                if _escape_done(self._escape):
                    self._escape = None
            elif ch == "\x1b":
                self._escape = ""
            elif ch in "\r\n":
                self.submitted.append(self.text)
                self.text = ""
            elif ch in "\x7f\x08":
                self.text = self.text[:-1]
            elif ch == "\x15":
                self.text = ""
            elif ch == "\x17":
                self.text = self.text.rstrip()
                self.text = self.text[: self.text.rfind(" ") + 1]
            elif ch == "\x04":
                if not self.text:
                    self.ended = True
            elif ch == "\t":
                self.text = (self.text + " ")[:MAX_INPUT]
            elif _CONTROL.fullmatch(ch) is None and len(self.text) < MAX_INPUT:
                self.text += ch
        return self.text != before or bool(self.submitted)


def _escape_done(sequence: str) -> bool:
    """Whether an escape sequence (what followed ESC so far) is complete: CSI (``[`` then
    parameters and one final byte), SS3 (``O`` and one byte), or any other single character."""
    if not sequence:
        return False
    if sequence[0] == "[":
        return len(sequence) > 1 and "@" <= sequence[-1] <= "~"
    if sequence[0] == "O":
        return len(sequence) == 2
    return True
