"""Companion voices: a small synthesizer interface and an espeak-ng implementation."""

from .base import Speech, SynthesisError, SynthesisFailure, Synthesizer
from .espeak import EMOTION_PROSODY, EspeakSynthesizer, Prosody, pick_voice
from .wav import WavError, parse_wav

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
