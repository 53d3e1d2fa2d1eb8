"""Speaking a line out loud for the terminal client, and knowing when the audio has finished.

The line is synthesized with the project's :class:`~companion.voice.Synthesizer` (espeak-ng by
default) and its PCM is piped to an audio player process; the utterance is over when the player
exits, which is when the terminal reports the ``speak`` query done. Without a player on the
machine, espeak-ng plays the line itself (it also exits when the audio has finished).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import trio

from companion.log import log_event
from companion.voice import EspeakSynthesizer, SynthesisError, Synthesizer, pick_voice

__all__ = ["PLAYERS", "DirectEspeakVoice", "PlayerVoice", "Voice", "VoiceError", "find_voice"]

logger = logging.getLogger("companion.listen.voice")

PLAYERS: Final[tuple[tuple[str, ...], ...]] = (
    ("aplay", "-q", "-t", "raw", "-f", "S16_LE", "-c", "1", "-r", "{rate}", "-"),
    ("paplay", "--raw", "--format=s16le", "--channels=1", "--rate={rate}"),
    ("pw-play", "--format=s16", "--channels=1", "--rate={rate}", "-"),
    ("play", "-q", "-t", "raw", "-e", "signed", "-b", "16", "-c", "1", "-r", "{rate}", "-"),
)
"""Audio players that take raw signed 16-bit mono PCM on stdin; ``{rate}`` is the sample rate."""

PLAYBACK_SLACK: Final = 10.0
"""Seconds a player may take beyond the audio's own length before it counts as stuck."""


class VoiceError(RuntimeError):
    """The line could not be voiced (no engine, engine failed, player failed or stuck)."""


class Voice(Protocol):
    @property
    def name(self) -> str: ...

    async def say(self, text: str, emotion: str | None = None) -> None:
        """Return when the audio has finished; raise :class:`VoiceError` if it could not play."""
        ...


@dataclass(frozen=True)
class PlayerVoice:
    """Synthesize, then pipe the PCM to ``player`` (an argv template with ``{rate}``)."""

    synthesizer: Synthesizer
    player: Sequence[str]
    slack: float = PLAYBACK_SLACK

    @property
    def name(self) -> str:
        return f"{self.synthesizer.name}+{self.player[0]}"

    async def say(self, text: str, emotion: str | None = None) -> None:
        try:
            speech = await self.synthesizer.synthesize(text, emotion=emotion)
        except SynthesisError as exc:
            raise VoiceError(f"synthesis failed ({exc.reason}): {exc}") from exc
        if not speech.pcm:
            return
        argv = [part.replace("{rate}", str(speech.sample_rate)) for part in self.player]
        deadline = speech.duration + self.slack
        await _play(argv, speech.pcm, deadline, f"audio player {argv[0]!r}", f"{deadline:.1f}s")
        log_event(logger, "line_played", logging.DEBUG, seconds=round(speech.duration, 2), player=argv[0])


@dataclass(frozen=True)
class DirectEspeakVoice:
    """espeak-ng playing through its own audio output; it exits when the audio has finished."""

    executable: str = "espeak-ng"
    timeout: float = 120.0

    @property
    def name(self) -> str:
        return "espeak-ng"

    async def say(self, text: str, emotion: str | None = None) -> None:
        argv = [self.executable, "--stdin", "-v", pick_voice(text)]
        stdin = text.encode("utf-8", "replace")
        await _play(argv, stdin, self.timeout, self.executable, f"{self.timeout:g}s")


async def _play(argv: list[str], stdin: bytes, deadline: float, what: str, shown_deadline: str) -> None:
    """Run ``argv`` with ``stdin`` until it exits (the audio has finished), within ``deadline``
    seconds; a player missing, stuck or failing is a :class:`VoiceError` naming ``what``."""
    try:
        with trio.fail_after(deadline):
            done = await trio.run_process(
                argv, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
            )
    except FileNotFoundError as exc:
        raise VoiceError(f"{what} is not installed") from exc
    except trio.TooSlowError as exc:
        raise VoiceError(f"{what} did not finish within {shown_deadline}") from exc
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip()[:200]
        raise VoiceError(f"{what} exited {done.returncode}: {detail}")


def find_voice(player: Sequence[str] | None = None) -> Voice | None:
    """The best voice on this machine: espeak-ng into a player, or espeak-ng alone; ``None``
    when espeak-ng is missing. ``player`` overrides the player search."""
    if not EspeakSynthesizer.available():
        return None
    synthesizer = EspeakSynthesizer()
    if player:
        return PlayerVoice(synthesizer, tuple(player))
    for candidate in PLAYERS:
        if shutil.which(candidate[0]) is not None:
            return PlayerVoice(synthesizer, candidate)
    return DirectEspeakVoice()
