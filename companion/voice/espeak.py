"""espeak-ng as a :class:`~companion.voice.base.Synthesizer`: a subprocess per line.

espeak-ng is small, offline and in every distribution, which makes it the default voice on a
robot or a headless speaker. The text goes in on stdin (never as an argument, so a line that
starts with ``-`` is still just text); the WAV comes back on stdout. Each call has a deadline,
and trio kills the process when the caller is cancelled.
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import trio

from companion.log import log_event
from companion.voice.base import Speech, SynthesisError
from companion.voice.wav import WavError, parse_wav

__all__ = ["EMOTION_PROSODY", "EspeakSynthesizer", "Prosody", "pick_voice"]

logger = logging.getLogger("companion.voice")


@dataclass(frozen=True, slots=True)
class Prosody:
    """espeak-ng's pitch (0..99) and speed (words per minute) for one emotion."""

    pitch: int = 50
    speed: int = 175


EMOTION_PROSODY: Mapping[str, Prosody] = MappingProxyType(
    {
        # aikyo's speak tool sends one of these four emotions with every line.
        "neutral": Prosody(50, 175),
        "happy": Prosody(62, 190),
        "sad": Prosody(38, 150),
        "angry": Prosody(45, 200),
    }
)


def _is_japanese(ch: str) -> bool:
    code = ord(ch)
    return 0x3040 <= code <= 0x30FF or 0x4E00 <= code <= 0x9FFF or 0xFF66 <= code <= 0xFF9F


def pick_voice(text: str, default: str = "en") -> str:
    """A voice for the script the line is written in (aikyo's companions often speak Japanese)."""
    if any(_is_japanese(ch) for ch in text):
        return "ja"
    if any(0xAC00 <= ord(ch) <= 0xD7A3 for ch in text):
        return "ko"
    return default


@dataclass(frozen=True)
class EspeakSynthesizer:
    """Synthesizes with the ``espeak-ng`` binary.

    ``voice=None`` picks a voice from the line's script (:func:`pick_voice`); ``timeout`` bounds
    each call; ``max_chars`` refuses lines that would produce minutes of audio.
    """

    voice: str | None = None
    default_voice: str = "en"
    timeout: float = 10.0
    max_chars: int = 2000
    executable: str = "espeak-ng"
    prosody: Mapping[str, Prosody] = field(default_factory=lambda: EMOTION_PROSODY)

    @property
    def name(self) -> str:
        return f"espeak-ng:{self.voice or 'auto'}"

    @staticmethod
    def available(executable: str = "espeak-ng") -> bool:
        """Whether the binary is on ``PATH`` (tests skip with a reason when it is not)."""
        return shutil.which(executable) is not None

    def command(self, text: str, emotion: str | None = None) -> list[str]:
        """The argument vector for one line (the text itself goes to stdin)."""
        prosody = self.prosody.get(emotion or "neutral", self.prosody.get("neutral", Prosody()))
        voice = self.voice or pick_voice(text, self.default_voice)
        return [
            self.executable,
            "--stdout",
            "--stdin",
            "-b",
            "1",
            "-v",
            voice,
            "-p",
            str(prosody.pitch),
            "-s",
            str(prosody.speed),
        ]

    async def synthesize(self, text: str, *, emotion: str | None = None) -> Speech:
        if len(text) > self.max_chars:
            raise SynthesisError("too_long", f"line has {len(text)} characters, limit {self.max_chars}")
        if not text.strip():
            return Speech(pcm=b"", sample_rate=22050)
        argv = self.command(text, emotion)
        start = trio.current_time()
        try:
            with trio.fail_after(self.timeout):
                done = await trio.run_process(
                    argv,
                    stdin=text.encode("utf-8", "replace"),
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
        except FileNotFoundError as exc:
            raise SynthesisError("unavailable", f"{self.executable} is not installed: {exc}") from exc
        except trio.TooSlowError as exc:
            log_event(logger, "synthesis_timeout", logging.WARNING, timeout=self.timeout, chars=len(text))
            raise SynthesisError("timeout", f"{self.executable} took longer than {self.timeout}s") from exc
        if done.returncode != 0:
            detail = done.stderr.decode("utf-8", "replace").strip()[:300]
            log_event(logger, "synthesis_failed", logging.WARNING, returncode=done.returncode, stderr=detail)
            raise SynthesisError("failed", f"{self.executable} exited {done.returncode}: {detail}")
        try:
            speech = parse_wav(done.stdout)
        except WavError as exc:
            raise SynthesisError("failed", f"{self.executable} wrote no usable WAV: {exc}") from exc
        log_event(
            logger,
            "synthesized",
            logging.DEBUG,
            engine=self.name,
            chars=len(text),
            seconds=round(speech.duration, 3),
            took_ms=math.ceil((trio.current_time() - start) * 1000),
        )
        return speech
