"""The built-in tools every card may name: ``speak``, ``speak_with_voice`` and ``companions``.

Wire shapes follow aikyo's core tools so existing aikyo clients keep working: a ``message.send``
with ``metadata.emotion``, and a ``speak`` query whose body is ``{message, emotion}``.
"""

from __future__ import annotations

import logging
from typing import Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from ..log import log_event
from ..protocol import Message, Metadata
from .context import ActionContext
from .definition import action, knowledge
from .results import QueryTimeout

__all__ = [
    "VOICE_QUERY",
    "VOICE_TIMEOUT",
    "Emotion",
    "NoInput",
    "SpeakInput",
    "companions",
    "speak",
    "speak_with_voice",
]

logger = logging.getLogger("companion.actions.builtins")

Emotion: TypeAlias = Literal["happy", "sad", "angry", "neutral"]

VOICE_QUERY: Final = "speak"
VOICE_TIMEOUT: Final = 100.0
"""Seconds to wait for a client to finish speaking before the message goes out anyway (as aikyo)."""


class SpeakInput(BaseModel):
    message: str = Field(min_length=1, description="What to say, as it should be heard.")
    to: list[str] = Field(
        description=(
            "Ids of the recipients. Unless you are speaking privately to particular companions, "
            "include every companion who has taken part in the conversation."
        )
    )
    emotion: Emotion = Field(description="The feeling to express while saying it.")


class NoInput(BaseModel):
    """A tool that takes no input."""

    model_config = ConfigDict(title="NoInput")


def _message(ctx: ActionContext[SpeakInput]) -> Message:
    return Message.create(
        ctx.companion_id, ctx.input.to, ctx.input.message, metadata={"emotion": ctx.input.emotion}
    )


@action(
    id="speak",
    description="Say something to the given recipients.",
    input=SpeakInput,
    topic="messages",
    timeout=10.0,
)
def speak(ctx: ActionContext[SpeakInput]) -> Message:
    """Publish the utterance at once."""
    return _message(ctx)


@action(
    id="speak_with_voice",
    description="Say something out loud to the given recipients (waits until it has been spoken).",
    input=SpeakInput,
    topic="messages",
    timeout=VOICE_TIMEOUT + 20.0,
)
async def speak_with_voice(ctx: ActionContext[SpeakInput]) -> Message:
    """Ask clients to voice the text, wait for playback to end, then publish the message.

    Turns are paced by real speech; a client that fails, or no client at all, only delays the
    message by the voice deadline, it never silences the companion.
    """
    body = {"message": ctx.input.message, "emotion": ctx.input.emotion}
    try:
        answer = await ctx.send_query(VOICE_QUERY, body, timeout=VOICE_TIMEOUT)
    except QueryTimeout:
        log_event(logger, "voice_timeout", logging.WARNING, call_id=ctx.call_id, timeout=VOICE_TIMEOUT)
    else:
        if answer.error is not None or (answer.result is not None and not answer.result.success):
            log_event(
                logger,
                "voice_failed",
                logging.WARNING,
                call_id=ctx.call_id,
                error=answer.error or "success=false",
            )
    return _message(ctx)


@knowledge(
    id="companions",
    description="List the companions currently on the network (id, name, personality, story, sample).",
    input=NoInput,
    output=dict[str, Metadata],
    timeout=5.0,
)
def companions(ctx: ActionContext[NoInput]) -> dict[str, Metadata]:
    """Who is on the network right now, by id."""
    return dict(ctx.companions)
