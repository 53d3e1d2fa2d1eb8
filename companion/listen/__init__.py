"""The terminal client: the conversation live, typed messages, spoken lines, approvals.

:mod:`.core` holds the logic without a terminal; :mod:`.client` is the trio shell around a
WebSocket to the bridge; :mod:`.voice` speaks lines and says when the audio has finished.
"""

from companion.listen.client import DirectoryError, ListenOptions, fetch_companions, run_listener
from companion.listen.core import Effect, ListenSession, Quit, Send, Show, Speak
from companion.listen.voice import DirectEspeakVoice, PlayerVoice, Voice, VoiceError, find_voice

__all__ = [
    "DirectEspeakVoice",
    "DirectoryError",
    "Effect",
    "ListenOptions",
    "ListenSession",
    "PlayerVoice",
    "Quit",
    "Send",
    "Show",
    "Speak",
    "Voice",
    "VoiceError",
    "fetch_companions",
    "find_voice",
    "run_listener",
]
