"""The messages of a model conversation, built and read: chat turns, tool results, retries.

pydantic-ai's message parts are the one vocabulary of every provider; these helpers build the
requests a call sends (the speaker's chat turns, answered tool calls, a retry spelling out what
was wrong) and read its answers (a tool call's arguments, the text), and turn a conversation with
tool messages into plain text for servers that take none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryFeedbackPart,
    RetryInfo,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from companion.models.prompts import Turns
from companion.models.structured import Problems, parse_json_object

__all__ = [
    "answer",
    "call_args",
    "chat",
    "feedback",
    "flatten",
    "has_tool_messages",
    "nudge",
    "output_of",
    "retry",
    "text_of",
]


def has_tool_messages(messages: Sequence[ModelMessage]) -> bool:
    return any(
        isinstance(part, (ToolCallPart, ToolReturnPart)) for message in messages for part in message.parts
    )


def flatten(messages: Sequence[ModelMessage]) -> list[ModelMessage]:
    """The same conversation without tool messages: calls and results written out as text."""
    out: list[ModelMessage] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            said = [p.content for p in message.parts if isinstance(p, TextPart) and p.content.strip()]
            said += [
                f"(called {p.tool_name} with {p.args_as_json_str()})"
                for p in message.parts
                if isinstance(p, ToolCallPart)
            ]
            out.append(ModelResponse(parts=[TextPart(" ".join(said) or "(no answer)")]))
            continue
        parts: list[ModelRequestPart] = []
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                parts.append(UserPromptPart(f"Result of {part.tool_name}: {part.model_response_str()}"))
            elif isinstance(part, RetryFeedbackPart):
                content = (
                    part.content if isinstance(part.content, str) else json.dumps(part.content, default=str)
                )
                parts.append(UserPromptPart(content))
            else:
                parts.append(part)
        out.append(ModelRequest(parts=parts, instructions=message.instructions))
    return out


def text_of(response: ModelResponse) -> str:
    return "".join(p.content for p in response.parts if isinstance(p, TextPart)).strip()


def call_args(call: ToolCallPart) -> dict[str, Any] | None:
    """A tool call's arguments, or ``None`` when they are not a JSON object."""
    try:
        return call.args_as_dict(raise_if_invalid=True)
    except (ValueError, AssertionError):
        return None


def answer(call: ToolCallPart, result: Mapping[str, Any], ok: bool) -> ToolReturnPart:
    return ToolReturnPart(
        tool_name=call.tool_name,
        content=json.dumps(result, ensure_ascii=False, default=str),
        tool_call_id=call.tool_call_id,
        outcome="success" if ok else "failed",
    )


def retry(call: ToolCallPart, message: str) -> ToolReturnPart:
    return ToolReturnPart(
        tool_name=call.tool_name, content=message, tool_call_id=call.tool_call_id, outcome="retried"
    )


def output_of(response: ModelResponse, tool_name: str) -> tuple[ToolCallPart | None, dict[str, Any] | None]:
    """The output tool call and its arguments; or, from a model that wrote JSON as text, that."""
    for part in response.parts:
        if isinstance(part, ToolCallPart) and part.tool_name == tool_name:
            return part, call_args(part)
    text = text_of(response)
    return None, parse_json_object(text) if text else None


def feedback(
    response: ModelResponse, call: ToolCallPart | None, problems: Problems, instructions: str
) -> ModelRequest:
    """The retry request: every tool call answered (providers insist), the problems spelled out."""
    detail = "Fix these problems and call the tool again:\n" + "\n".join(f"- {p}" for p in problems.items)
    parts: list[ModelRequestPart] = []
    for part in response.parts:
        if isinstance(part, ToolCallPart):
            parts.append(
                retry(part, detail if part is call else f"Ignored: {part.tool_name} is not available.")
            )
    if call is None:
        parts.append(RetryFeedbackPart(detail, retry=RetryInfo("validation_error")))
    return ModelRequest(parts=parts, instructions=instructions)


def nudge(words: str) -> RetryFeedbackPart:
    """The model asked again, in ``words`` (it answered, but nobody heard anything)."""
    return RetryFeedbackPart(words, retry=RetryInfo("model_retry"))


def chat(turns: Turns, prompt: str, instructions: str) -> list[ModelMessage]:
    """The conversation's earlier ``turns`` as chat messages (the speaker's own lines its own
    turns), then ``prompt`` as the last user turn; the same instructions on every request."""
    messages: list[ModelMessage] = [
        ModelResponse(parts=[TextPart(text)])
        if mine
        else ModelRequest(parts=[UserPromptPart(text)], instructions=instructions)
        for mine, text in turns
    ]
    return [*messages, ModelRequest(parts=[UserPromptPart(prompt)], instructions=instructions)]
