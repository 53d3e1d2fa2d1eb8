"""What companions say about their own turn, in words a person reads: thinking, giving up, the end.

A speaker announces that it started preparing a reply (``companion.thinking``) and, when it
cannot reply, that it gives its slot up (``companion.yield`` with a reason); both are
``action.send`` envelopes on ``actions`` (see docs/clients.md). Without them a person watching
a slow or failing model sees nothing for minutes. This module is pure: :class:`Waiting` keeps
who is thinking since when, and the functions turn signals and states arrays into the lines a
client shows (``companion listen``, and the demo's transcript, :mod:`companion.conversation.transcript`; the
page words them the same way in ``web/app.js``). Everything here is network input: names,
reasons and details are folded onto one line, stripped of control characters and bounded
before they reach a screen.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from companion.conversation.events import (
    MAX_DETAIL,
    MAX_SIGNAL_ID,
    THINKING_SIGNAL,
    YIELD_REASONS,
    YIELD_SIGNAL,
    ThinkingSeen,
    parse_signal,
)
from companion.conversation.rules import ends_conversation
from companion.models.lexicon import clean

__all__ = [
    "MAX_DETAIL",
    "REASON_WORDS",
    "THINKING_DEADLINE",
    "THINKING_SIGNAL",
    "YIELD_REASONS",
    "YIELD_SIGNAL",
    "Signal",
    "Waiting",
    "ends_conversation",
    "one_line",
    "read_signal",
    "thinking_text",
    "yield_text",
]

REASON_WORDS: Final[Mapping[str, str]] = {
    "model_error": "the model failed",
    "timeout": "the model timed out",
    "crashed": "it crashed while preparing its reply",
    "no_reply": "the model gave no reply",
    "stopping": "it is stopping",
}
"""Each failure reason in plain words (``terminal`` is not a failure: :func:`yield_text`)."""

THINKING_DEADLINE: Final = 300.0
"""Stop showing a thinking speaker after this long without its reply or yield: a lost signal
must never leave an endless spinner."""
MAX_NAME: Final = 60
MAX_REASON: Final = 40
MAX_ID: Final = MAX_SIGNAL_ID
MAX_THINKERS: Final = 32
"""At most this many speakers tracked at once (oldest dropped): signals are network input."""
SHOWN_THINKERS: Final = 3

_FORMAT_CONTROLS = re.compile(r"[\u061c\u2066-\u2069]")
"""Bidi controls :func:`companion.models.lexicon.clean` keeps (it strips the others)."""


def one_line(text: str, limit: int) -> str:
    """``text`` on one line, without control characters or lone surrogates, at most ``limit``
    characters (cut with an ellipsis): safe to print in a terminal and to set as text."""
    folded = clean(_FORMAT_CONTROLS.sub(" ", text[: limit * 4]), limit + 1)
    return folded if len(folded) <= limit else folded[: limit - 1].rstrip() + "…"


def thinking_text(name: str, seconds: int) -> str:
    return f"{name} is thinking… ({seconds} s)"


def yield_text(name: str, reason: str, detail: str | None) -> str:
    """The line for a speaker that gave its slot up, e.g. ``Juniper could not answer: the model
    timed out (no answer in 60 s); the turn passes to the next companion``. A ``terminal`` yield
    says only that this companion's own limit is reached (cards may differ): the conversation
    ends for everyone with a states array at ``terminal``, never with a yield."""
    if reason == "terminal":
        return f"{name} has nothing more to say; the turn passes to the next companion"
    words = REASON_WORDS.get(reason) or f"it gave up ({one_line(reason, MAX_REASON) or 'no reason given'})"
    shown = one_line(detail, MAX_DETAIL) if detail else ""
    because = f" ({shown})" if shown else ""
    return f"{name} could not answer: {words}{because}; the turn passes to the next companion"


@dataclass(frozen=True, slots=True)
class Signal:
    """A thinking or yield signal read from an action (:func:`read_signal`)."""

    name: str
    speaker: str
    in_reply_to: str
    reason: str = ""
    detail: str | None = None


def read_signal(speaker: str, name: str, params: Mapping[str, Any]) -> Signal | None:
    """The signal in an action's ``name`` and ``params``, or ``None`` when it is not one of the
    two signals from a companion or lacks what a signal must carry (then it is dropped): read by
    the machine's own reader (:func:`~companion.conversation.events.parse_signal`), one set of
    rules for the companions and their clients."""
    seen = parse_signal(speaker, name, params)
    if seen is None:
        return None
    if isinstance(seen, ThinkingSeen):
        return Signal(THINKING_SIGNAL, speaker, seen.in_reply_to)
    return Signal(
        YIELD_SIGNAL, speaker, seen.in_reply_to, seen.reason, seen.detail if "detail" in params else None
    )


@dataclass(slots=True)
class _Thinking:
    in_reply_to: str
    since: float


@dataclass
class Waiting:
    """Who is preparing a reply, since when (the client's clock when the signal arrived)."""

    deadline: float = THINKING_DEADLINE
    _thinkers: OrderedDict[str, _Thinking] = field(default_factory=OrderedDict)

    def start(self, speaker: str, in_reply_to: str, now: float) -> None:
        """``speaker`` started preparing its reply to ``in_reply_to`` (a speaker prepares one reply
        at a time: a new signal replaces its old one; a repeat keeps the count running)."""
        current = self._thinkers.get(speaker)
        if current is not None and current.in_reply_to == in_reply_to:
            return
        self._thinkers.pop(speaker, None)
        self._thinkers[speaker] = _Thinking(in_reply_to, now)
        while len(self._thinkers) > MAX_THINKERS:
            self._thinkers.popitem(last=False)

    def stop(self, speaker: str, in_reply_to: str | None = None) -> bool:
        """``speaker`` replied (``in_reply_to`` ``None``: to anything) or gave its slot up for
        ``in_reply_to``; whether it was thinking about it."""
        current = self._thinkers.get(speaker)
        if current is None or (in_reply_to is not None and current.in_reply_to != in_reply_to):
            return False
        del self._thinkers[speaker]
        return True

    def clear(self) -> None:
        self._thinkers.clear()

    def __len__(self) -> int:
        return len(self._thinkers)

    def expire(self, now: float) -> list[str]:
        """Speakers thinking for longer than the deadline, no longer shown."""
        gone = [s for s, t in self._thinkers.items() if now - t.since >= self.deadline]
        for speaker in gone:
            del self._thinkers[speaker]
        return gone

    def status(self, now: float, name: Callable[[str], str]) -> str:
        """``Juniper is thinking… (12 s)`` for each speaker (a few, then how many more), or ``""``."""
        parts = [
            thinking_text(one_line(name(speaker), MAX_NAME), _seconds(now - t.since))
            for speaker, t in list(self._thinkers.items())[:SHOWN_THINKERS]
        ]
        more = len(self._thinkers) - SHOWN_THINKERS
        if more > 0:
            parts.append(f"and {more} more")
        return " · ".join(parts)

    def next_change(self, now: float) -> float | None:
        """When :meth:`status` next reads differently (a counter's next second or a deadline)."""
        times = []
        for t in self._thinkers.values():
            times.append(t.since + _seconds(now - t.since) + 1)
            times.append(t.since + self.deadline)
        return min(times) if times else None


def _seconds(elapsed: float) -> int:
    """Whole seconds elapsed; a clock read a hair early still counts the second it woke for."""
    return max(0, math.floor(elapsed + 1e-6))
