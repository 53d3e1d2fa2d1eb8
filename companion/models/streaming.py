"""A speak request streamed through pydantic-ai, and the line read out of the partial answer.

The speaker's answer is streamed (``pydantic_ai.direct.model_request_stream``) so that its line
can be heard before the model has finished writing it. After every streamed event the partial
:class:`~pydantic_ai.messages.ModelResponse` is read for the line so far: the ``message`` of a
speaking tool's call, whose arguments arrive as fragments of JSON (parsed with pydantic-core's
partial mode, which keeps a string still being written), or a plain-text answer's first line
(a text answer is the line, see :func:`~.structured.spoken_text`). What is read goes to a
callback; what the callback does with it (sentences, the voice) is the speaker's business.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Final

import pydantic_core
from pydantic_ai import direct
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings

from companion.lines.directions import MAYBE_LABEL, SPEAKER_LABEL, own_label, without_directions
from companion.lines.fields import line_field
from companion.lines.sentences import whole_sentences_of
from companion.models.base import ToolSpec

__all__ = [
    "ENDED_EARLY",
    "MAX_PARTIAL_CHARS",
    "Partial",
    "ended_early",
    "partial_line",
    "stream_response",
    "text_line_ended",
    "whole_sentences",
    "with_line",
]

Partial = Callable[[ModelResponse], bool]
"""Called with the response so far after each streamed event (on the asyncio side: keep it quick);
``False`` when the rest of the answer is of no use (the stream is closed, and the answer so far is
the response)."""

MAX_PARTIAL_CHARS: Final = 16_000
"""Partial answers longer than this are not read any more (each event parses the whole answer so
far: a server streaming megabytes would cost quadratic time). A spoken line is about 400
characters; the complete answer is still handled as usual."""
_NOT_SPEECH: Final = tuple("{[<`")
"""A text answer that starts with one of these is JSON, markup or code: never read out early."""


async def stream_response(
    model: Model,
    messages: Sequence[ModelMessage],
    settings: ModelSettings,
    params: ModelRequestParameters,
    partial: Partial,
) -> ModelResponse:
    """One streamed request (an asyncio coroutine: run it through :func:`.aio.run_asyncio`)."""
    async with direct.model_request_stream(
        model, list(messages), model_settings=settings, model_request_parameters=params
    ) as stream:
        async for _event in stream:
            if not partial(stream.get()):
                break  # leaving the block closes the stream: the server stops writing
        return stream.get()


def partial_line(
    response: ModelResponse,
    tools: Mapping[str, ToolSpec],
    text_tool: str | None,
    speaker_names: Iterable[str] = (),
) -> tuple[str, str] | None:
    """``(tool id, line so far)`` of a partial answer, or ``None`` while it shows no line.

    ``tools`` maps wire names to tools; ``text_tool`` is the id of the tool a plain-text answer
    is said through (``None``: text is not read). The first call of an action that takes a
    message wins; text counts only when no tool is called. ``speaker_names``: the speaker's own
    names, its label and its name called at the line's start are not shown.
    """
    speaker_names = tuple(speaker_names)  # read twice below: a generator would be spent
    calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
    if sum(len(p.args) if isinstance(p.args, str) else 0 for p in calls) > MAX_PARTIAL_CHARS:
        return None
    for call in calls:
        spec = tools.get(call.tool_name)
        if spec is None or spec.kind != "action":
            continue
        line = _message_of(call.args)
        if line is not None:
            return _shown(spec.id, line, speaker_names)
    if calls or text_tool is None:
        return None
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart)).lstrip()
    if not text or text.startswith(_NOT_SPEECH) or len(text) > MAX_PARTIAL_CHARS:
        return None
    first = text.split("\n", 1)[0]
    label = SPEAKER_LABEL.match(first)
    if label is None and MAYBE_LABEL.match(first) and "\n" not in text:
        return None
    if label and own_label(label.group(1), speaker_names):
        first = first[label.end() :]
    return _shown(text_tool, first.lstrip("\"'“ "), speaker_names)


def text_line_ended(response: ModelResponse) -> bool:
    """Whether a plain-text answer's line is complete: its first line has ended. Nothing after
    it is ever said (the line is the first paragraph, :func:`~.structured.spoken_text`), and a
    small model writes on to its token limit there ("(One sentence). You must take the dog out
    to the park.", SmolLM2-135M: 1.5 s more, measured), so the stream may close."""
    if any(isinstance(p, ToolCallPart) for p in response.parts):
        return False
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart)).lstrip()
    return "\n" in text


def _shown(tool_id: str, line: str, speaker_names: Iterable[str]) -> tuple[str, str] | None:
    """The line so far as it may be shown: without the stage directions before its first word
    and the speaker's own name called (held back while either may still come), as the complete
    line will be said."""
    said = without_directions(line, complete=False, speaker=speaker_names)
    return None if said is None else (tool_id, said)


ENDED_EARLY: Final = "companion_ended_early"
"""The key of a response's ``provider_details`` that marks a stream the server ended before its
finish chunk (:class:`~.finish.FinishingStreamedResponse`: llama-cpp-python ends the one in
progress when another request comes)."""


def ended_early(response: ModelResponse) -> bool:
    """Whether ``response`` is a stream the server ended before its finish chunk (its
    ``finish_reason`` then says ``length``: it is cut back as one the token limit cut)."""
    return bool((response.provider_details or {}).get(ENDED_EARLY))


def whole_sentences(response: ModelResponse, *, stopped: bool = False) -> tuple[ModelResponse, bool]:
    """``response`` with its line cut back to its complete sentences when the model stopped at its
    token limit, and whether anything was cut.

    A server at ``max_tokens`` stops mid-word, mid-sentence and, for a tool call, mid-JSON
    (llama-cpp-python, measured: ``{ "message" : "Sea-story``): the half-written sentence would
    be voiced and published as if whole. The limit shows as ``finish_reason`` "length", or, from
    llama-cpp-python with a named tool (which says "tool_calls", measured), as arguments whose
    JSON stops before its end. The voice has said only complete sentences while the answer
    streamed, so what is left is exactly what it said; an answer with no complete sentence is
    left with an empty line, which the line check refuses as any empty line. ``stopped``: the
    stream was closed before its end (its line could no longer be said), which cuts it the same.
    A stream the server ended before its finish chunk says "length" too (:func:`ended_early`)."""
    calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
    cut_short = stopped or response.finish_reason == "length"
    if not cut_short and not any(_unfinished_json(p.args) for p in calls):
        return response, False
    cut = False

    def cut_back(line: str) -> str:
        nonlocal cut
        whole = whole_sentences_of(line)
        cut |= whole != line
        return whole

    return _lines_rewritten(response, cut_back), cut


def with_line(
    response: ModelResponse, line: str, fill: Callable[[str], Mapping[str, object] | None]
) -> ModelResponse:
    """``response`` saying ``line``: the line its live line settled as heard (see
    :attr:`~.base.LineSink.settled`), in place of what the model wrote around and after it.

    Its stream was closed as soon as the line settled, so a tool call's arguments usually stop
    inside their line, before the others (``to``, ``emotion``) were written: the arguments
    written whole are kept, and ``fill(tool name)`` gives the rest (the call that says a line
    to the turn's recipients, :func:`~.structured.speech_args`)."""

    def complete(name: str, args: dict[str, object], unfinished: bool) -> dict[str, object]:
        # the last argument of a cut JSON was still being written when the stream closed
        written = dict(list(args.items())[:-1]) if unfinished else args
        return {**(fill(name) or {}), **written}

    return _lines_rewritten(response, lambda _written: line, complete)


def _lines_rewritten(
    response: ModelResponse,
    rewrite: Callable[[str], str],
    complete: Callable[[str, dict[str, object], bool], dict[str, object]] = lambda _n, args, _u: args,
) -> ModelResponse:
    """``response`` with the line of each tool call that carries one, and each text part,
    replaced by ``rewrite`` of it; ``complete(tool name, arguments, cut)`` gives a call's other
    arguments."""
    parts = []
    for part in response.parts:
        if isinstance(part, ToolCallPart):
            args = _args_of(part.args) or {}
            field = line_field(args)
            if field is not None:
                line = rewrite(str(args[field]))
                args = complete(part.tool_name, args, _unfinished_json(part.args))
                # written back whole: a cut JSON would not parse as arguments
                part = replace(part, args=pydantic_core.to_json({**args, field: line}).decode())
        elif isinstance(part, TextPart):
            part = replace(part, content=rewrite(part.content))
        parts.append(part)
    return replace(response, parts=parts)


def _unfinished_json(args: object) -> bool:
    """Whether tool arguments are JSON that stops before its end (a cut answer's)."""
    if not isinstance(args, str) or not args.strip():
        return False
    try:
        pydantic_core.from_json(args)
    except ValueError:
        try:
            pydantic_core.from_json(args, allow_partial="trailing-strings")
        except ValueError:
            return False  # not JSON at all: the arguments are refused as they always were
        return True
    return False


def _args_of(args: object) -> dict[str, object] | None:
    """Tool arguments as a dict, however far their JSON was written."""
    if isinstance(args, str):
        try:
            args = pydantic_core.from_json(args, allow_partial="trailing-strings") if args else {}
        except ValueError:
            return None
    return args if isinstance(args, dict) else None


def _message_of(args: object) -> str | None:
    """The message string of partial (or complete) tool arguments."""
    parsed = _args_of(args)
    field = None if parsed is None else line_field(parsed)
    return None if parsed is None or field is None else str(parsed[field])
