"""The voice track's playlist as plain data: lines in order, cut into 20 ms frames.

The audio sender pulls one frame every 20 ms. A line counts as *played* once its last frame
has been handed over and the sender comes back for the next one: by then that frame has been
encoded and sent. That moment is what the speak query's result waits for, so the
conversation is paced by speech. No clock and no I/O here; the track supplies the pacing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "FRAME_BYTES",
    "FRAME_SAMPLES",
    "SAMPLE_RATE",
    "FrameStep",
    "QueueFull",
    "VoiceQueue",
]

SAMPLE_RATE: Final = 48_000
"""The track's rate: what WebRTC's Opus runs at, so the encoder never resamples."""
FRAME_SAMPLES: Final = 960
"""20 ms at 48 kHz, WebRTC's usual audio packet."""
FRAME_BYTES: Final = FRAME_SAMPLES * 2
SILENCE: Final = bytes(FRAME_BYTES)


@dataclass(frozen=True, slots=True)
class FrameStep:
    """One 20 ms frame to send, and the lines whose audio is now completely sent."""

    pcm: bytes
    finished: tuple[str, ...] = ()
    playing: str | None = None
    """The line this frame belongs to (``None``: silence)."""


@dataclass(frozen=True, slots=True)
class QueueFull:
    """A line was refused: the queue already holds too much speech."""

    reason: str


@dataclass
class _Line:
    key: str
    pcm: bytes
    offset: int = 0


@dataclass
class VoiceQueue:
    """Lines waiting to be spoken, the one being spoken, and what was just completed."""

    max_lines: int = 32
    max_seconds: float = 600.0
    _lines: deque[_Line] = field(default_factory=deque)
    _sent_last_frame: list[str] = field(default_factory=list)
    _queued_bytes: int = 0

    def add(self, key: str, pcm: bytes) -> QueueFull | None:
        """Queue a line (48 kHz s16 mono). ``QueueFull`` when it would exceed the limits."""
        if len(pcm) % 2:
            raise ValueError("pcm must hold whole 16-bit samples")
        if any(line.key == key for line in self._lines):
            raise ValueError(f"line {key!r} is already queued")
        if len(self._lines) >= self.max_lines:
            return QueueFull(f"{len(self._lines)} lines already waiting (limit {self.max_lines})")
        seconds = (self._queued_bytes + len(pcm)) / (2 * SAMPLE_RATE)
        if seconds > self.max_seconds:
            return QueueFull(f"{seconds:.0f} s of speech would be waiting (limit {self.max_seconds:.0f} s)")
        self._lines.append(_Line(key, pcm))
        self._queued_bytes += len(pcm)
        return None

    def next_frame(self) -> FrameStep:
        """The next 20 ms to send. Called once per frame by the track."""
        finished = tuple(self._sent_last_frame)
        self._sent_last_frame.clear()
        while self._lines and self._lines[0].offset >= len(self._lines[0].pcm):
            # an empty line: it has nothing to send, so it is done once reached
            finished += (self._pop().key,)
        if not self._lines:
            return FrameStep(SILENCE, finished)
        line = self._lines[0]
        chunk = line.pcm[line.offset : line.offset + FRAME_BYTES]
        line.offset += len(chunk)
        if line.offset >= len(line.pcm):
            self._pop()
            self._sent_last_frame.append(line.key)
        if len(chunk) < FRAME_BYTES:
            chunk += bytes(FRAME_BYTES - len(chunk))
        return FrameStep(chunk, finished, line.key)

    def flush(self) -> list[str]:
        """Drop every line not yet completely sent (the one playing too), in queue order.

        A line whose last frame already went out is not dropped: it will be reported finished.
        """
        dropped = [line.key for line in self._lines]
        self._lines.clear()
        self._queued_bytes = 0
        return dropped

    def take_finished(self) -> list[str]:
        """Lines whose last frame was handed over but not yet confirmed (at teardown)."""
        done = list(self._sent_last_frame)
        self._sent_last_frame.clear()
        return done

    def _pop(self) -> _Line:
        line = self._lines.popleft()
        self._queued_bytes -= len(line.pcm)
        return line

    def __len__(self) -> int:
        return len(self._lines)

    def __contains__(self, key: object) -> bool:
        return any(line.key == key for line in self._lines) or key in self._sent_last_frame

    @property
    def idle(self) -> bool:
        return not self._lines and not self._sent_last_frame
