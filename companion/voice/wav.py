"""Reading the RIFF/WAVE bytes a synthesizer writes to stdout.

espeak-ng streams its WAV header before it knows the length, so the RIFF and ``data`` sizes
hold a placeholder (0x7ffffff0); the real length is whatever follows the header. Python's
``wave`` module trusts those sizes, hence this small parser.
"""

from __future__ import annotations

import struct

from companion.voice.base import SAMPLE_WIDTH, Speech

__all__ = ["WavError", "parse_wav"]

_PCM_FORMAT = 1


class WavError(ValueError):
    """The bytes are not 16-bit PCM WAV."""


def parse_wav(data: bytes) -> Speech:
    """Mono 16-bit PCM WAV bytes -> :class:`Speech` (a truncated trailing half-sample is dropped)."""
    if len(data) < 12 or data[0:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise WavError("not a RIFF/WAVE stream")
    pos = 12
    sample_rate: int | None = None
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        (size,) = struct.unpack_from("<I", data, pos + 4)
        body = pos + 8
        if chunk_id == b"fmt ":
            if size < 16 or body + 16 > len(data):
                raise WavError("fmt chunk too short")
            fmt, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, body)
            if fmt != _PCM_FORMAT or bits != 8 * SAMPLE_WIDTH:
                raise WavError(f"expected 16-bit PCM, got format {fmt} with {bits} bits")
            if channels != 1:
                raise WavError(f"expected mono, got {channels} channels")
            sample_rate = rate
        elif chunk_id == b"data":
            if sample_rate is None:
                raise WavError("data chunk before fmt chunk")
            end = min(len(data), body + size)
            end -= (end - body) % SAMPLE_WIDTH
            return Speech(pcm=data[body:end], sample_rate=sample_rate)
        pos = body + size + (size & 1)
    raise WavError("no data chunk")
