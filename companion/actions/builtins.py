"""The built-in tools every card may name: ``speak``, ``speak_with_voice`` and ``companions``.

Wire shapes follow aikyo's core tools so existing aikyo clients keep working: a ``message.send``
with ``metadata.emotion``, and a ``speak`` query whose body is ``{message, emotion}``: one query
per sentence, in order, each waited for (an aikyo client speaks each as it comes), with the
sentence's place in its line in ``params.metadata`` (``{line, part, last}``, which aikyo drops).
The speaker's live line (:data:`LIVE_LINE`) starts the sentences while the model still writes.

Models often address people and companions by name (``["juniper", "Ostra"]``) or not at all:
``speak`` maps names to ids (:func:`resolve_recipients`), leaves the speaker out, and refuses an
empty ``to`` with an error that lists whom the model can address, so it can try again. (The
conversation engine goes further before the call: it drops ids nobody in the conversation has,
and after one refusal falls back to the previous speaker and the people.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import Final, Literal, Protocol, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from companion.actions.context import ActionContext
from companion.actions.definition import action, knowledge
from companion.actions.results import ActionRefused, QueryTimeout
from companion.lines.sentences import join_sentences, split_sentences
from companion.log import log_event
from companion.protocol import COMPANION_ID_PREFIX, SPEAK_QUERY, Message, Metadata, QueryResult, new_id

__all__ = [
    "LIVE_LINE",
    "PREVIEW",
    "VOICE_QUERY",
    "VOICE_TIMEOUT",
    "VOICE_TOOL",
    "Emotion",
    "LiveLine",
    "NoInput",
    "SpeakInput",
    "companions",
    "interrupted",
    "no_recipients",
    "resolve_recipients",
    "speak",
    "speak_with_voice",
]

logger = logging.getLogger("companion.actions.builtins")

Emotion: TypeAlias = Literal["happy", "sad", "angry", "neutral"]

VOICE_QUERY: Final = SPEAK_QUERY
"""The query that voices a line (the wire's ``speak``), under the name the engine knows."""
VOICE_TIMEOUT: Final = 100.0
"""Seconds to wait for a client to finish speaking a line before the message goes out anyway (as
aikyo, whose one query held the whole line)."""
VOICE_TOOL: Final = "speak_with_voice"
SENTENCE_WAIT_BASE: Final = 4.0
SENTENCE_WAIT_PER_CHAR: Final = 0.15
"""A sentence's answer is awaited ``BASE + PER_CHAR × characters`` seconds (within the line's
wait): espeak-ng says about 15 characters a second; the rest is synthesis and a loaded page."""
DEAF_WAIT: Final = 0.25
"""Once a client left a sentence unanswered, each later one of the line is awaited only this long:
they still go out in order (a client that queues hears them), the message is not held up."""
VOICE_PUBLISH_MARGIN: Final = 1.0
"""Seconds kept, of whatever deadline the caller runs this under, for publishing the message
after the voice wait (see :func:`speak_with_voice`)."""


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


def resolve_recipients(
    to: Sequence[str],
    *,
    me: str,
    companions: Mapping[str, str],
    people: Iterable[str],
    keep_unknown: bool = False,
) -> tuple[list[str], list[str]]:
    """``(ids, unknown)``: the entries of ``to`` as recipient ids, and those that name nobody.

    ``companions`` maps the companion ids one may address to their names, ``people`` are the
    ids of the people in the conversation. An id stays; a companion's name, its id in other
    case or without ``companion_``, or a person's id in other case, becomes the id. The speaker
    itself is left out; order is kept, duplicates dropped. With ``keep_unknown``, entries that
    name nobody stay in ``ids`` as they are (and are still listed in ``unknown``).
    """
    ids = {cid: cid for cid in companions}
    by_key: dict[str, str] = {}
    for cid, name in companions.items():
        for key in (name, cid, cid.removeprefix(COMPANION_ID_PREFIX)):
            by_key.setdefault(key.strip().casefold(), cid)
    for person in people:
        ids[person] = person
        by_key.setdefault(person.casefold(), person)
    out: list[str] = []
    unknown: list[str] = []
    for entry in to:
        found = ids.get(entry) or by_key.get(entry.strip().lstrip("@").casefold())
        if found is None:
            unknown.append(entry)
            if keep_unknown and entry.strip() and entry != me:
                out.append(entry)
        elif found != me:
            out.append(found)
    return list(dict.fromkeys(out)), unknown


def no_recipients(
    to: Sequence[str], unknown: Sequence[str], companions: Mapping[str, str], people: Iterable[str]
) -> str:
    """The refusal a model gets for a ``to`` that names nobody: what was wrong, whom it can address."""
    valid = [f"{cid} ({name})" if name != cid else cid for cid, name in companions.items()]
    valid += [p for p in people if p not in companions]
    wrong = f"unknown: {', '.join(repr(u) for u in list(unknown)[:5])}" if unknown else "it is empty"
    return (
        f"'to' names nobody you can address ({wrong}); use ids or names from: "
        f"{', '.join(valid[:20]) or 'nobody is known yet'}. Call the tool again with them."
    )


def _recipients(ctx: ActionContext[SpeakInput]) -> list[str]:
    """The input's ``to`` with names of the companions present, or of those who spoke in the
    history, as their ids; other entries stay as they are. Refused if nobody is left."""
    companions = {cid: meta.name for cid, meta in ctx.companions.items()}
    people: list[str] = []
    for message in ctx.history:
        sender = message.params.from_
        if sender.startswith(COMPANION_ID_PREFIX):
            companions.setdefault(sender, sender)
        else:
            people.append(sender)
    people = list(dict.fromkeys(people))
    ids, unknown = resolve_recipients(
        ctx.input.to, me=ctx.companion_id, companions=companions, people=people, keep_unknown=True
    )
    if not ids:
        raise ActionRefused(no_recipients(ctx.input.to, unknown, companions, people))
    return ids


def _message(ctx: ActionContext[SpeakInput], to: list[str]) -> Message:
    return Message.create(ctx.companion_id, to, ctx.input.message, metadata={"emotion": ctx.input.emotion})


@action(
    id="speak",
    description="Say something to the given recipients.",
    input=SpeakInput,
    topic="messages",
    timeout=10.0,
)
def speak(ctx: ActionContext[SpeakInput]) -> Message:
    """Publish the utterance at once."""
    return _message(ctx, _recipients(ctx))


@action(
    id="speak_with_voice",
    description="Say something out loud to the given recipients (waits until it has been spoken).",
    input=SpeakInput,
    topic="messages",
    timeout=VOICE_TIMEOUT + 20.0,
)
async def speak_with_voice(ctx: ActionContext[SpeakInput]) -> Message:
    """Ask clients to voice the text a sentence at a time, wait for playback to end, then
    publish the message: the whole line, or, when the speaker's live line voiced it as the model
    wrote it, exactly what it said.

    Turns are paced by real speech; a client that fails, or no client at all, only delays the
    message by the voice deadline, it never silences the companion.
    """
    to = _recipients(ctx)  # before the voice: a refused message is not heard either
    message = _message(ctx, to)
    preview = PREVIEW.get()
    if preview is not None:  # the text is complete: the next turn may start while it is voiced
        preview(message)
    live = LIVE_LINE.get()
    refusal: str | None = None
    if live is None or not live.voices(ctx.tool_id):
        sentences = split_sentences(ctx.input.message) or [ctx.input.message]
        count = await _voice_sentences(ctx, sentences)
        said = ctx.input.message if count == len(sentences) else join_sentences(sentences[:count])
    else:
        said = await live.finish(ctx.input.message, ctx.input.emotion, _voice_wait(ctx))
        # refused by the live line's check (this line's, not an earlier one's): that refusal,
        # which asks the model for another line
        refusal = live.refusal
    if not said:
        raise ActionRefused(
            refusal
            or "nothing of that line was said (the voice was interrupted or refused it): "
            "do not say it again this turn"
        )
    if said == message.params.message:
        return message
    # Same id, other text: whoever holds work from the preview drops it (it differs).
    return message.model_copy(update={"params": message.params.model_copy(update={"message": said})})


class LiveLine(Protocol):
    """The speaker's line being voiced while the model writes it (``companion.engine.voiceline``)."""

    def voices(self, tool_id: str) -> bool:
        """Whether this line's sentences are the ones of a call of ``tool_id``."""
        ...

    async def finish(self, text: str, emotion: str, wait: float) -> str:
        """Voice what of ``text`` (the complete line) is not voiced yet, wait at most ``wait``
        seconds for the clients, and return the text said: what the message may publish."""
        ...

    @property
    def refusal(self) -> str | None:
        """Why the line was refused with nothing of it said (a sentence the check refused), if
        it was: what the model is told, so it writes another."""
        ...


LIVE_LINE: ContextVar[LiveLine | None] = ContextVar("companion_live_line", default=None)
"""The live line of the speaker's turn, set by the speaker around the model's call (the handler
runs in the speaker's task, whose context it inherits); ``None`` anywhere else."""

PREVIEW: ContextVar[Callable[[Message], None] | None] = ContextVar("companion_preview", default=None)
"""Where ``speak_with_voice`` hands its message once its text is complete, before it is voiced
(the speaker sets it around its tool calls; the engine publishes it as a preview, see
:mod:`companion.conversation.preview`); ``None`` anywhere else. It must not block."""


def sentence_wait(sentence: str) -> float:
    """Seconds a client may take to say ``sentence`` before it counts as not answering."""
    return SENTENCE_WAIT_BASE + SENTENCE_WAIT_PER_CHAR * len(sentence)


def voice_metadata(line: str, part: int, last: bool) -> dict[str, object]:
    """A sentence query's ``params.metadata``: which line, which sentence, whether the last."""
    return {"line": line, "part": part, "last": last}


def interrupted(answer: QueryResult) -> bool:
    """Whether a client answered a sentence as cut short by the person (``{"interrupted": true}``,
    as the WebRTC voice answers a ``stop``): nothing more of that line is to be voiced."""
    result = answer.result
    return result is not None and not result.success and result.body.get("interrupted") is True


async def _voice_sentences(ctx: ActionContext[SpeakInput], sentences: Sequence[str]) -> int:
    """Each sentence as its own ``speak`` query, in order, each waited for in turn; how many
    were said (all of them, unless a client interrupted one: those before it)."""
    line, deaf = new_id(), False
    for part, sentence in enumerate(sentences):
        left = _voice_wait(ctx)
        wait = min(left, DEAF_WAIT if deaf else sentence_wait(sentence))
        body = {"message": sentence, "emotion": ctx.input.emotion}
        meta = voice_metadata(line, part, part == len(sentences) - 1)
        try:
            answer = await ctx.send_query(VOICE_QUERY, body, timeout=wait, metadata=meta)
        except QueryTimeout:
            if not deaf:
                log_event(
                    logger,
                    "voice_timeout",
                    logging.WARNING,
                    call_id=ctx.call_id,
                    part=part,
                    timeout=round(wait, 3),
                )
            deaf = True
            continue
        if interrupted(answer):
            log_event(logger, "voice_interrupted", call_id=ctx.call_id, part=part)
            return part
        if answer.error is not None or (answer.result is not None and not answer.result.success):
            log_event(
                logger,
                "voice_failed",
                logging.WARNING,
                call_id=ctx.call_id,
                part=part,
                error=answer.error or "success=false",
            )
    return len(sentences)


def _voice_wait(ctx: ActionContext[SpeakInput]) -> float:
    """How long to wait for the voice: :data:`VOICE_TIMEOUT`, but never so long that the deadline
    this call runs under (its own, or the speaker's turn budget around it: the offline engine gives
    a speaker 8 s, and a line of two sentences takes 6 s to say) ends the call before the message
    is out. A slow voice then costs the audio, never the words (measured: a page voicing a line
    over WebRTC on a loaded machine took longer than the turn, and the companion fell silent)."""
    return max(min(VOICE_TIMEOUT, ctx.time_left - VOICE_PUBLISH_MARGIN), 0.05)


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
