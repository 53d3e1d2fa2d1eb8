"""Opus encoding ahead of time: a line is encoded once, when it is queued, not frame by frame.

aiortc would otherwise encode every 20 ms frame on a worker thread, silence included, for
every session. Here silence is one packet made once, and a line is encoded in one batch (off
the event loop); the track hands the packets to aiortc, which only packetizes them.
"""

from __future__ import annotations

import fractions
from collections.abc import Sequence
from functools import cache
from typing import Final

import av

from companion.rtc.voicequeue import FRAME_BYTES, FRAME_SAMPLES, SAMPLE_RATE, pcm_frames

__all__ = ["OPUS_BITRATE", "OpusLineEncoder", "encode_opus", "opus_silence"]

OPUS_BITRATE: Final = 32_000
"""Plenty for one voice (WebRTC's default for speech is 32 kbit/s)."""
_TIME_BASE: Final = fractions.Fraction(1, SAMPLE_RATE)


def _encoder() -> av.AudioCodecContext:
    codec = av.CodecContext.create("libopus", "w")
    assert isinstance(codec, av.AudioCodecContext)
    codec.sample_rate = SAMPLE_RATE
    codec.layout = "mono"
    codec.format = "s16"
    codec.bit_rate = OPUS_BITRATE
    codec.time_base = _TIME_BASE
    codec.options = {"application": "voip"}
    return codec


class OpusLineEncoder:
    """Encodes one line, possibly in pieces (the first few frames at once, the rest later).

    One encoder per line: lines start and end in silence, so nothing is lost at the seams.
    Blocking (about half a millisecond per frame on a small machine): encode large pieces
    from a worker thread.
    """

    def __init__(self) -> None:
        self._codec = _encoder()
        self._frames_in = 0
        self._packets_out = 0

    def encode(self, frames: Sequence[bytes]) -> list[bytes]:
        """Packets for ``frames`` (20 ms of 48 kHz s16 mono each); the encoder's look-ahead
        holds the last one back until the next call or :meth:`finish`."""
        packets: list[bytes] = []
        for chunk in frames:
            frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
            frame.planes[0].update(chunk)
            frame.sample_rate = SAMPLE_RATE
            frame.time_base = _TIME_BASE
            frame.pts = self._frames_in * FRAME_SAMPLES
            self._frames_in += 1
            packets += [bytes(p) for p in self._codec.encode(frame)]
        self._packets_out += len(packets)
        return packets

    def finish(self) -> list[bytes]:
        """The packets still held back: in all, exactly one packet per frame."""
        packets = [bytes(p) for p in self._codec.encode(None)]
        packets = packets[: max(0, self._frames_in - self._packets_out)]
        self._packets_out += len(packets)
        return packets

    def encode_rest(self, frames: Sequence[bytes]) -> list[bytes]:
        """:meth:`encode` then :meth:`finish`: the rest of the line (for a worker thread)."""
        return self.encode(frames) + self.finish()


def encode_opus(pcm: bytes) -> list[bytes]:
    """48 kHz s16 mono PCM -> one Opus packet per 20 ms (the last frame padded with silence)."""
    return OpusLineEncoder().encode_rest(pcm_frames(pcm))


@cache
def opus_silence() -> bytes:
    """One Opus packet of 20 ms silence (from a warmed-up encoder, so it is a plain one)."""
    return encode_opus(bytes(FRAME_BYTES * 3))[-1]
