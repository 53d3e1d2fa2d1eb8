"""Language models behind a companion: the interface the engine needs and its implementations."""

from .base import (
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
