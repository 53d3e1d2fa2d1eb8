"""The model interface the conversation engine needs: exactly three kinds of call per turn.

1. :meth:`CompanionModel.decide_states` — the turn's leader asks once for the states of every
   addressed companion (aikyo spends one call per companion here).
2. :meth:`CompanionModel.fill_params` — the speaker fills its card's ``events.params``.
3. :meth:`CompanionModel.speak` — the speaker runs with the trigger instructions and its card's
   tools; tool calls go through the action runtime via ``call_tool``. A model that streams
   shows the line as it writes it to :attr:`SpeakRequest.live` (a :class:`LineSink`), so the
   voice can start at the first sentence.

Requests are plain frozen values so a model is testable without a network or an engine. The
vocabulary they are made of lives with its owner and is only re-exported here: ``ToolInstruction``
in :mod:`companion.card.triggers` (what a condition asks for), ``ToolSpec`` in :mod:`companion.actions`
(a tool as the model sees it), ``StateDecision`` in :mod:`companion.conversation.rules` (one state
the leader's model decided).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias

from companion.actions.definition import ToolSpec
from companion.card.triggers import ToolInstruction
from companion.conversation.rules.states import StateDecision
from companion.models.errors import ModelError
from companion.protocol import ClosingStage, Message, Metadata

__all__ = [
    "CompanionModel",
    "LineSink",
    "ModelCall",
    "ModelError",
    "ModelWrapper",
    "ParamsRequest",
    "SpeakRequest",
    "StateDecision",
    "StatesRequest",
    "ToolCaller",
    "ToolInstruction",
    "ToolSpec",
]


ToolCaller = Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]
"""``call_tool(tool_id, input) -> model-facing JSON result`` (status, output or error message)."""


@dataclass(frozen=True, slots=True)
class StatesRequest:
    """Everything the leader's model needs to decide every addressed companion's state."""

    message: Message
    """The message that started this turn."""
    companions: Sequence[Metadata]
    """The addressed, active companions, in the order of ``message.params.to``."""
    history: Sequence[Message]
    """Recent conversation, oldest first (the triggering message last)."""
    nominated: str | None = None
    """A companion the sender explicitly asked to speak next (must be marked ``selected``)."""
    closing_floor: ClosingStage = "none"
    """The least advanced closing stage allowed (repetition or turn limit pushes it forward)."""
    turn: int = 0
    """How many turns this conversation has had."""


@dataclass(frozen=True, slots=True)
class ParamsRequest:
    """The speaker fills its card's ``events.params`` JSON Schema from the conversation."""

    me: Metadata
    role: str
    schema: Mapping[str, Any]
    message: Message
    history: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    """The card's tools, as the speak call that follows names them (a provider's instructions
    for both calls say how the speaker's words reach the others)."""


class LineSink(Protocol):
    """Where a streaming model shows the line it is writing, before its tool call is complete."""

    def grow(self, tool_id: str, text: str) -> None:
        """``text`` is all the model has written so far of the message of a call of ``tool_id``
        (the whole of it each time, as a partial parse gives it). Synchronous and quick: it is
        called for every streamed token."""
        ...

    @property
    def abandoned(self) -> bool:
        """Whether nothing more of the line being written can be said (its first sentence was
        refused, nothing of it heard): the model may stop writing it, and try another."""
        ...

    @property
    def refusal(self) -> str | None:
        """Why the line being written was refused, once it is :attr:`abandoned` (nothing of it
        heard): a refused line, which the model's next try must not repeat. ``None`` otherwise."""
        ...

    @property
    def settled(self) -> str | None:
        """The line as it will be published, once nothing more of it can be said after some of
        it was heard (a later sentence refused, the voice interrupted): the model may stop
        writing, and its line is this. ``None`` otherwise."""
        ...


@dataclass(frozen=True, slots=True)
class SpeakRequest:
    """The speaker's turn: instructions from the triggers, tools from the card."""

    me: Metadata
    role: str
    message: Message
    history: Sequence[Message]
    instructions: Sequence[ToolInstruction]
    tools: Sequence[ToolSpec]
    recipients: Sequence[str]
    """Who the reply should address by default (the previous speaker and the others present)."""
    closing: ClosingStage = "none"
    extra: Mapping[str, Any] = field(default_factory=dict)
    live: LineSink | None = None
    """Shown the line while it is written (models that do not stream may ignore it: the tool
    call's whole message is then the line)."""
    assessed: Mapping[str, Any] | None = None
    """The card's parameters (its ``events.params`` JSON Schema) when a parameters call comes
    before this one, every turn, because a condition reads them: a provider describes them in
    the instructions both calls share, so the parameters call needs a few words of task or none."""


class CompanionModel(Protocol):
    """What the engine needs from a language model. Implementations must be cancellable."""

    @property
    def name(self) -> str: ...

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]: ...

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]: ...

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None: ...


ModelCall: TypeAlias = Literal["decide_states", "fill_params", "speak"]
"""The three calls of a turn, by the name of the :class:`CompanionModel` method."""


class ModelWrapper:
    """A model that wraps another one call by call (to count its calls, to time them).

    The wrapped model's name, and whatever else the engine reads from a model
    (``parallel_params``, ``streams_speech``, ``speculates``, ``works_ahead``, ``states_for_one``), are the
    wrapped one's, read each time (a provider's depend on the server its check found): a wrapper
    never turns streaming or prepared replies off. A subclass says what happens around each
    call in :meth:`_around`.
    """

    def __init__(self, inner: CompanionModel) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # (not set yet: no wrapped model to ask)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _around(self, call: ModelCall, message: Message) -> AbstractContextManager[object]:
        """Entered around each call of the wrapped model; ``message`` is the one it answers."""
        return nullcontext()

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        with self._around("decide_states", request.message):
            return await self.inner.decide_states(request)

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        with self._around("fill_params", request.message):
            return await self.inner.fill_params(request)

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        with self._around("speak", request.message):
            await self.inner.speak(request, call_tool)
