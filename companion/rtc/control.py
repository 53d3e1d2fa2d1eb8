"""Control frames a WebRTC client may send besides the Firehose frames.

They steer the session's voice and never reach the network:

- ``{"control": "stop"}`` — stop speaking now: the line playing and every queued line are
  dropped, and their speak queries are answered as interrupted.
- ``{"control": "voice", "enabled": false}`` — stop answering speak queries with audio (and
  flush); ``true`` turns it back on (only on a session that negotiated an audio track). The
  session answers with ``{"control": "voice", "enabled": STATE}``, the state now in force.

A person's own ``message.send`` also flushes the queue: what the companions were about to
say belongs to the conversation the person just interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from companion.protocol import MESSAGES

__all__ = ["Control", "ControlError", "StopSpeech", "VoiceSwitch", "interpret_control", "is_new_message"]


@dataclass(frozen=True, slots=True)
class StopSpeech:
    pass


@dataclass(frozen=True, slots=True)
class VoiceSwitch:
    enabled: bool


@dataclass(frozen=True, slots=True)
class ControlError:
    message: str


Control: TypeAlias = StopSpeech | VoiceSwitch


def interpret_control(obj: Any) -> Control | ControlError | None:
    """``None`` when ``obj`` is not a control frame (it goes to the bridge unchanged)."""
    if not isinstance(obj, dict) or "control" not in obj:
        return None
    kind = obj["control"]
    if kind == "stop":
        return StopSpeech()
    if kind == "voice":
        enabled = obj.get("enabled")
        if not isinstance(enabled, bool):
            return ControlError('{"control": "voice"} needs "enabled": true or false')
        return VoiceSwitch(enabled)
    return ControlError(f'unknown control {kind!r}; use "stop" or "voice"')


def is_new_message(obj: Any) -> bool:
    """Whether a client frame publishes a ``message.send`` (the person speaks)."""
    if not isinstance(obj, dict) or obj.get("topic") != MESSAGES:
        return False
    body = obj.get("body")
    return isinstance(body, dict) and body.get("method") == "message.send"
