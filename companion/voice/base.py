"""What a voice engine gives the rest of the system: a line of text in, mono PCM out.

The interface is small on purpose so a better engine (a neural TTS, a cloud voice) can replace
espeak-ng without touching the WebRTC session or the terminal client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias

__all__ = ["Speech", "SynthesisError", "SynthesisFailure", "Synthesizer"]

SAMPLE_WIDTH = 2
"""Bytes per sample: every :class:`Speech` is signed 16-bit little-endian mono."""


@dataclass(frozen=True, slots=True)
class Speech:
    """One synthesized line: signed 16-bit little-endian mono samples at ``sample_rate``."""

    pcm: bytes
    sample_rate: int

    def __post_init__(self) -> None:
        if self.sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {self.sample_rate}")
        if len(self.pcm) % SAMPLE_WIDTH:
            raise ValueError("pcm must hold whole 16-bit samples")

    @property
    def samples(self) -> int:
        return len(self.pcm) // SAMPLE_WIDTH

    @property
    def duration(self) -> float:
        """Seconds of audio."""
        return self.samples / self.sample_rate


SynthesisFailure: TypeAlias = Literal["unavailable", "timeout", "too_long", "failed"]


class SynthesisError(RuntimeError):
    """The line could not be synthesized; ``reason`` is a stable label, the message says why."""

    def __init__(self, reason: SynthesisFailure, message: str) -> None:
        super().__init__(message)
        self.reason: SynthesisFailure = reason


class Synthesizer(Protocol):
    """Turns one line into audio. Implementations must be cancellable and bound their own time."""

    @property
    def name(self) -> str: ...

    async def synthesize(self, text: str, *, emotion: str | None = None) -> Speech:
        """Synthesize ``text``; raise :class:`SynthesisError` when it cannot."""
        ...
