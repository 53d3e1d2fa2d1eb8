"""Building blocks of the model tests: companions of a group and an opening, the tools a card
gives its speaker, the requests the engine makes of a model, a tool caller that records, and
models on the fake server."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from companion.models.base import (
    ParamsRequest,
    SpeakRequest,
    StatesRequest,
    ToolSpec,
)
from companion.models.providers import ProviderConfig, ProviderModel, resolve_config
from companion.protocol import Message, Metadata
from support.cards import metadata as md
from support.fake_llm_server import (
    FakeLLMServer,
)

AYA = Metadata(
    id="companion_aya", name="Aya", personality="cheerful, curious", story="a baker", sample="Yay!"
)


BEN = md("ben", name="Ben", personality="calm", story="a sailor", sample="Hm. Fair.")


KAI = md("kai", name="Kai", personality="witty", story="a coder", sample="Heh.")
OPENING = Message.create("user_1", [AYA.id, BEN.id, KAI.id], "Hi all! Ben, what did you see at sea?")


SPEAK = ToolSpec(
    id="speak",
    description="Say something to others.",
    input_schema={
        "type": "object",
        "properties": {
            "message": {"type": "string"},
            "to": {"type": "array", "items": {"type": "string"}},
            "emotion": {"type": "string", "enum": ["neutral", "happy", "sad"]},
        },
        "required": ["message", "to"],
    },
)


WAVE = ToolSpec(id="wave", description="Wave a hand.", input_schema={"type": "object", "properties": {}})


COMPANIONS = ToolSpec(
    id="companions",
    description="Who is in the conversation.",
    input_schema={"type": "object", "properties": {}},
    kind="knowledge",
)


PARAMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "mood": {"type": "string", "enum": ["happy", "bored", "curious"]},
        "interest": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["mood", "interest"],
}


def states_request(**overrides: Any) -> StatesRequest:
    fields: dict[str, Any] = {"message": OPENING, "companions": [AYA, BEN, KAI], "history": [OPENING]}
    fields.update(overrides)
    return StatesRequest(**fields)


def speak_request(**overrides: Any) -> SpeakRequest:
    fields: dict[str, Any] = {
        "me": BEN,
        "role": "a storyteller",
        "message": OPENING,
        "history": [OPENING],
        "instructions": [],
        "tools": [SPEAK, COMPANIONS],
        "recipients": ["user_1"],
    }
    fields.update(overrides)
    return SpeakRequest(**fields)


def openai_model(srv: FakeLLMServer, **config: Any) -> ProviderModel:
    base = resolve_config(
        "openai", "fake-1", base_url=srv.openai_base_url, environ={"OPENAI_API_KEY": "sk-test"}
    )
    fields = {f: getattr(base, f) for f in ("kind", "model_name", "api_key", "base_url")}
    fields.update(config)
    return ProviderModel(ProviderConfig(**fields))


class ToolRecorder:
    """The engine's side of speak: records calls and answers like the action runtime does."""

    def __init__(self, answers: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers = dict(answers or {})

    async def __call__(self, tool_id: str, args: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls.append((tool_id, dict(args)))
        return self.answers.get(tool_id, {"status": "ok", "output": {"published": True}})


def params_request(schema: Mapping[str, Any] = PARAMS_SCHEMA) -> ParamsRequest:
    return ParamsRequest(me=BEN, role="a storyteller", schema=schema, message=OPENING, history=[OPENING])


def anthropic_model(srv: FakeLLMServer) -> ProviderModel:
    return ProviderModel(
        resolve_config(
            "anthropic",
            "claude-fake",
            base_url=srv.anthropic_base_url,
            environ={"ANTHROPIC_API_KEY": "sk-test"},
        )
    )
