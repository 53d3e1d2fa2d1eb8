"""The voice track: aiortc pulls a frame every 20 ms; we hand out the playlist at real-time pace.

This class lives on the asyncio side (aiortc's sender awaits :meth:`VoiceTrack.recv`). The
playlist itself is the pure :class:`~companion.rtc.voicequeue.VoiceQueue`, shared with the
trio side of the session; both run on the same thread, so no lock is needed. Silence is
sent between lines: the RTP clock keeps running and the far end's jitter buffer stays warm.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from companion.rtc.audio import audio_frame
from companion.rtc.voicequeue import FRAME_SAMPLES, SAMPLE_RATE, VoiceQueue

__all__ = ["VoiceTrack"]

_TIME_BASE: Final = fractions.Fraction(1, SAMPLE_RATE)
MAX_LAG: Final = 0.5
"""Behind schedule by more than this (a stalled loop), the pace restarts instead of bursting."""


class VoiceTrack(MediaStreamTrack):
    """An outgoing audio track that plays a :class:`VoiceQueue` in real time."""

    kind = "audio"

    def __init__(
        self,
        queue: VoiceQueue,
        on_finished: Callable[[Sequence[str]], None],
        *,
        encoded: bool = False,
        clock: Callable[[], float] = time.monotonic,
        on_frame: Callable[[str | None], None] | None = None,
    ) -> None:
        """``encoded``: the queue holds Opus packets (see :mod:`.opus`), else 20 ms of PCM."""
        super().__init__()
        self.queue = queue
        self.encoded = encoded
        self._on_finished = on_finished
        self._on_frame = on_frame
        self._clock = clock
        self._start: float | None = None
        self._pts = 0
        self.frames_sent = 0

    async def recv(self) -> av.AudioFrame | av.Packet[Any]:
        if self.readyState != "live":
            raise MediaStreamError
        now = self._clock()
        if self._start is None:
            self._start = now
        else:
            self._pts += FRAME_SAMPLES
            due = self._start + self._pts / SAMPLE_RATE
            if now - due > MAX_LAG:
                self._start = now - self._pts / SAMPLE_RATE
            elif due > now:
                await asyncio.sleep(due - now)
        if self.readyState != "live":
            raise MediaStreamError
        step = self.queue.next_frame()
        if step.finished:
            self._on_finished(step.finished)
        if self._on_frame is not None:
            self._on_frame(step.playing)
        self.frames_sent += 1
        if not self.encoded:
            return audio_frame(step.frame, self._pts)
        packet = av.Packet(step.frame)
        packet.pts = self._pts
        packet.time_base = _TIME_BASE
        return packet
