"""Language models behind a companion: the interface the engine needs and its implementations."""

from companion.models.base import (
    CompanionModel,
    ModelError,
    ParamsRequest,
    SpeakRequest,
    StateDecision,
    StatesRequest,
    ToolCaller,
    ToolInstruction,
    ToolSpec,
)

__all__ = [
    "CompanionModel",
    "ModelError",
    "ParamsRequest",
    "SpeakRequest",
    "StateDecision",
    "StatesRequest",
    "ToolCaller",
    "ToolInstruction",
    "ToolSpec",
]
