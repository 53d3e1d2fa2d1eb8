"""Companion voices: a small synthesizer interface and an espeak-ng implementation."""

from companion.voice.base import Speech, SynthesisError, SynthesisFailure, Synthesizer
from companion.voice.espeak import EMOTION_PROSODY, EspeakSynthesizer, Prosody, pick_voice
from companion.voice.wav import WavError, parse_wav

__all__ = [
    "EMOTION_PROSODY",
    "EspeakSynthesizer",
    "Prosody",
    "Speech",
    "SynthesisError",
    "SynthesisFailure",
    "Synthesizer",
    "WavError",
    "parse_wav",
    "pick_voice",
]
