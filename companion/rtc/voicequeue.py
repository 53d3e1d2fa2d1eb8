"""The voice track's playlist as plain data: lines in order, as 20 ms frames.

The audio sender pulls one frame every 20 ms. A line counts as *played* once its last frame
has been handed over and the sender comes back for the next one: by then that frame has been
encoded and sent. That moment is what the speak query's result waits for, so the
conversation is paced by speech. No clock and no I/O here; the track supplies the pacing.

A frame is opaque bytes: 20 ms of PCM, or one Opus packet encoded ahead of time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "FRAME_BYTES",
    "FRAME_SAMPLES",
    "FRAME_SECONDS",
    "PCM_SILENCE",
    "SAMPLE_RATE",
    "FrameStep",
    "QueueFull",
    "VoiceQueue",
    "pcm_frames",
]

SAMPLE_RATE: Final = 48_000
"""The track's rate: what WebRTC's Opus runs at, so the encoder never resamples."""
FRAME_SAMPLES: Final = 960
"""20 ms at 48 kHz, WebRTC's usual audio packet."""
FRAME_SECONDS: Final = FRAME_SAMPLES / SAMPLE_RATE
FRAME_BYTES: Final = FRAME_SAMPLES * 2
PCM_SILENCE: Final = bytes(FRAME_BYTES)


def pcm_frames(pcm: bytes) -> list[bytes]:
    """48 kHz s16 mono PCM cut into 20 ms frames, the last padded with silence."""
    if len(pcm) % 2:
        raise ValueError("pcm must hold whole 16-bit samples")
    frames = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]
    if frames and len(frames[-1]) < FRAME_BYTES:
        frames[-1] += bytes(FRAME_BYTES - len(frames[-1]))
    return frames


@dataclass(frozen=True, slots=True)
class FrameStep:
    """One 20 ms frame to send, and the lines whose audio is now completely sent."""

    frame: bytes
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
    frames: list[bytes]
    complete: bool = True
    position: int = 0

    @property
    def exhausted(self) -> bool:
        return self.complete and self.position >= len(self.frames)


@dataclass
class VoiceQueue:
    """Lines waiting to be spoken, the one being spoken, and what was just completed."""

    silence: bytes = PCM_SILENCE
    """The frame sent when no line is playing."""
    max_lines: int = 32
    max_seconds: float = 600.0
    _lines: deque[_Line] = field(default_factory=deque)
    _sent_last_frame: list[str] = field(default_factory=list)
    _queued_frames: int = 0

    def add(self, key: str, frames: Sequence[bytes], *, complete: bool = True) -> QueueFull | None:
        """Queue a line of 20 ms frames. ``QueueFull`` when it would exceed the limits.

        ``complete=False``: more frames follow with :meth:`extend` (the line starts playing
        while the rest is still being encoded; if the track catches up, it sends silence).
        """
        if any(line.key == key for line in self._lines):
            raise ValueError(f"line {key!r} is already queued")
        if len(self._lines) >= self.max_lines:
            return QueueFull(f"{len(self._lines)} lines already waiting (limit {self.max_lines})")
        seconds = (self._queued_frames + len(frames)) * FRAME_SECONDS
        if seconds > self.max_seconds:
            return QueueFull(f"{seconds:.0f} s of speech would be waiting (limit {self.max_seconds:.0f} s)")
        self._lines.append(_Line(key, list(frames), complete))
        self._queued_frames += len(frames)
        return None

    def extend(self, key: str, frames: Sequence[bytes], *, complete: bool = True) -> bool:
        """Append frames to a queued line; ``False`` if it is no longer queued (flushed)."""
        for line in self._lines:
            if line.key == key:
                line.frames.extend(frames)
                line.complete = line.complete or complete
                self._queued_frames += len(frames)
                return True
        return False

    def next_frame(self) -> FrameStep:
        """The next 20 ms to send. Called once per frame by the track."""
        finished = tuple(self._sent_last_frame)
        self._sent_last_frame.clear()
        while (
            self._lines and self._lines[0].complete and self._lines[0].position >= len(self._lines[0].frames)
        ):
            # an empty line: it has nothing to send, so it is done once reached
            finished += (self._pop().key,)
        if not self._lines:
            return FrameStep(self.silence, finished)
        line = self._lines[0]
        if line.position >= len(line.frames):
            return FrameStep(self.silence, finished, line.key)  # the rest is still being encoded
        frame = line.frames[line.position]
        line.position += 1
        if line.exhausted:
            self._pop()
            self._sent_last_frame.append(line.key)
        return FrameStep(frame, finished, line.key)

    def flush(self) -> list[str]:
        """Drop every line not yet completely sent (the one playing too), in queue order.

        A line whose last frame already went out is not dropped: it will be reported finished.
        """
        dropped = [line.key for line in self._lines]
        self._lines.clear()
        self._queued_frames = 0
        return dropped

    def take_finished(self) -> list[str]:
        """Lines whose last frame was handed over but not yet confirmed (at flush or teardown)."""
        done = list(self._sent_last_frame)
        self._sent_last_frame.clear()
        return done

    def _pop(self) -> _Line:
        line = self._lines.popleft()
        self._queued_frames -= len(line.frames)
        return line

    def __len__(self) -> int:
        return len(self._lines)

    def __contains__(self, key: object) -> bool:
        return any(line.key == key for line in self._lines) or key in self._sent_last_frame

    @property
    def idle(self) -> bool:
        return not self._lines and not self._sent_last_frame
