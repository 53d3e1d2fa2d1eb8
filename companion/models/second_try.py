"""What a real model's speaker does when the engine refuses its line: ask once more, fresh, then
say a line of the card's own.

Measured with SmolLM2-135M behind llama-cpp-python: a refused line sent back as a follow-up
(the model's answer, then the refusal as a tool result or pydantic-ai's retry framing) came back
as the next line ("Your previous response failed the application's validation ...", "That's not
a message from the user, it is a feedback to the application."), or the same line again; both
were refused, the speaker gave its slot up, and when all three companions did so on one message
the conversation ended unanswered after 2-4 replies (3 of 5 runs). So the second try is a new
request: the same prompt (its cached prefix reused) with the refusal folded into the task in
plain words that quote nothing, sampled with another seed. If that line is refused too, the
offline model (:class:`~.scripted.ScriptedModel`) says a line composed from the card for the
same message: in character, answering it, and checked like any other line (the engine refuses
it too if it repeats the conversation, and then the slot is given up).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from typing import Final

from companion.lines.check import NOT_SAID
from companion.log import log_event
from companion.models.base import SpeakRequest, ToolCaller
from companion.models.scripted import ScriptedModel

__all__ = ["fresh_seed", "is_line_refusal", "own_line", "task_after_refusal"]

_log = logging.getLogger("companion.models.providers")


def fresh_seed(message_id: str) -> int:
    """The sampling seed of the fresh request for the message ``message_id``: another than the
    first try's (a server with a fixed seed would write the same line for the nearly same
    prompt), and another for every message, so a refused line's second try is not the second
    try of the turn before (one fixed seed: SmolLM2-135M wrote "I'm excited to introduce you to
    a new world of people." as the second try of four turns running, measured)."""
    digest = hashlib.blake2b(message_id.encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


_CARD_MODEL: Final = ScriptedModel()


def is_line_refusal(message: str) -> bool:
    """Whether a tool result's message is the engine's refusal of a line (not another failure)."""
    return message.startswith(NOT_SAID)


def task_after_refusal(prompt: str, reason: str, name: str) -> str:
    """``prompt`` with the refusal folded into its task: what was wrong, in a few plain words,
    without quoting the refused line or the refusal (a small model repeats what it is shown)."""
    if "repeats" in reason:
        wrong = "it repeated a line that was already said"
    else:
        wrong = "it was not words that you say out loud"
    return (
        f"{prompt}\n(Your first try was not used: {wrong}.) "
        f"Now say something different, {name}: one or two short sentences, only your words."
    )


async def own_line(request: SpeakRequest, call_tool: ToolCaller, speaking_tool: str, model: str) -> None:
    """Say a line of the card's own through ``speaking_tool`` (the offline model's, for the same
    message and history), after the model's two lines were refused. Only the speaking tool is
    called: the model's other actions this turn stand as they ran."""
    log_event(
        _log,
        "speak_own_line",
        logging.WARNING,
        model=model,
        companion=request.me.id,
        reason="the model's two lines were refused: a line composed from the card instead",
    )
    instructions = [i for i in request.instructions if i.tool == speaking_tool]
    tools = [t for t in request.tools if t.id == speaking_tool]
    await _CARD_MODEL.speak(replace(request, instructions=instructions, tools=tools, live=None), call_tool)
