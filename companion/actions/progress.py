"""Progress reports: the pure rules (clamp, never backwards, rate limit) and the wire shape.

Clients see progress as ``action.send`` named ``progress`` on ``actions``; the runtime decides
when to send from :class:`ProgressGate`, which holds no clock of its own (``now`` is passed in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from companion.protocol import Action

__all__ = ["DEFAULT_MIN_INTERVAL", "PROGRESS_ACTION", "ProgressGate", "ProgressUpdate", "progress_action"]

PROGRESS_ACTION: Final = "progress"
DEFAULT_MIN_INTERVAL: Final = 0.25
"""At most four progress messages per second per call."""
MAX_MESSAGE_CHARS: Final = 200


@dataclass(frozen=True, slots=True)
class ProgressUpdate:
    percent: float
    message: str


def clamp_percent(value: float, floor: float) -> float:
    """0-100, never below ``floor`` (the last value); NaN keeps the last value."""
    if math.isnan(value):
        return floor
    return max(floor, min(100.0, max(0.0, value)))


class ProgressGate:
    """Decides, per call, which progress reports go out.

    A report goes out if it is the first, or if ``min_interval`` seconds passed since the last
    one sent, or if it is the first to reach 100 (the end is never swallowed). Reports between
    are dropped, not queued: the next one sent carries the latest value.
    """

    def __init__(self, min_interval: float = DEFAULT_MIN_INTERVAL) -> None:
        if not (min_interval >= 0 and math.isfinite(min_interval)):
            raise ValueError(f"min_interval must be a non-negative number, got {min_interval!r}")
        self._min_interval = min_interval
        self._percent = 0.0
        self._last_sent_at: float | None = None
        self._sent_percent: float | None = None

    @property
    def percent(self) -> float:
        """The latest value reported (after clamping), sent or not."""
        return self._percent

    def offer(self, percent: float, message: str, now: float) -> ProgressUpdate | None:
        """Record a report made at ``now``; return the update to send, or None to drop it."""
        self._percent = clamp_percent(float(percent), self._percent)
        finishing = self._percent >= 100.0 and (self._sent_percent is None or self._sent_percent < 100.0)
        due = self._last_sent_at is None or now - self._last_sent_at >= self._min_interval
        if not (due or finishing):
            return None
        self._last_sent_at = now
        self._sent_percent = self._percent
        return ProgressUpdate(self._percent, message[:MAX_MESSAGE_CHARS])


def progress_action(sender: str, tool_id: str, call_id: str, update: ProgressUpdate) -> Action:
    """The ``action.send`` clients receive: params ``{call_id, action, percent, message}``."""
    percent: float | int = int(update.percent) if update.percent.is_integer() else round(update.percent, 2)
    return Action.create(
        sender,
        PROGRESS_ACTION,
        {"call_id": call_id, "action": tool_id, "percent": percent, "message": update.message},
    )
