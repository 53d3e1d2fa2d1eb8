"""PCM conversions for the voice track: any synthesizer's rate to 48 kHz, and bytes to frames."""

from __future__ import annotations

import fractions

import av

from companion.rtc.voicequeue import FRAME_SAMPLES, SAMPLE_RATE
from companion.voice import Speech

__all__ = ["audio_frame", "to_track_rate"]

_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)


def to_track_rate(speech: Speech) -> bytes:
    """``speech`` as 48 kHz s16 mono bytes (libswresample, the resampler WebRTC's encoder uses)."""
    if speech.samples == 0:
        return b""
    if speech.sample_rate == SAMPLE_RATE:
        return speech.pcm
    frame = av.AudioFrame(format="s16", layout="mono", samples=speech.samples)
    frame.planes[0].update(speech.pcm)
    frame.sample_rate = speech.sample_rate
    frame.time_base = fractions.Fraction(1, speech.sample_rate)
    frame.pts = 0
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    out = bytearray()
    for piece in [*resampler.resample(frame), *resampler.resample(None)]:
        out += bytes(piece.planes[0])[: piece.samples * 2]
    return bytes(out)


def audio_frame(pcm: bytes, pts: int) -> av.AudioFrame:
    """One 20 ms frame for aiortc's sender; ``pts`` counts samples since the track started."""
    frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
    frame.planes[0].update(pcm)
    frame.sample_rate = SAMPLE_RATE
    frame.time_base = _TIME_BASE
    frame.pts = pts
    return frame
