"""Real language models through pydantic-ai: OpenAI-compatible endpoints and Anthropic.

Each :class:`ProviderModel` method opens one short session (an HTTP client on the trio-asyncio
loop, see :mod:`companion.models.aio`; each request through :class:`~.session.Session`) and
sends as few requests as the call allows:

- ``decide_states``: 1 request (2 if the first answer fails validation and is sent back once);
- ``fill_params``: 1 request (2 likewise);
- ``speak``: 1 request when the model calls only action tools; one more after a round that only
  looked something up, failed, or left an instructed action unused; at most
  ``max_speak_requests`` (3 by default). Each action runs at most once per turn. Speak requests
  are streamed when the request has a :class:`~.base.LineSink` (shown the line as it is
  written, see :mod:`.streaming`).

The provider SDKs never retry on their own (``max_retries=0``), so these counts are exact; the
engine decides what a failed turn means. Every request has a deadline (``request_timeout``), and
cancelling the trio caller aborts the HTTP request in flight.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Final, TypeVar

import httpx2
import trio
from pydantic_ai.exceptions import ModelAPIError, UnexpectedModelBehavior
from pydantic_ai.messages import (
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.output import OutputObjectDefinition
from pydantic_ai.settings import ModelSettings, ToolOrOutput
from pydantic_ai.tools import ToolDefinition

from companion.lines.check import NOT_SAID
from companion.log import log_event
from companion.models.aio import asyncio_loop, run_asyncio
from companion.models.base import (
    ModelError,
    ParamsRequest,
    SpeakRequest,
    StateDecision,
    StatesRequest,
    ToolCaller,
    ToolSpec,
)
from companion.models.endpoints import (
    DEFAULT_REQUEST_TIMEOUT,
    LOCAL_PLACEHOLDER_KEY,
    ProviderConfig,
    ProviderKind,
    is_loopback_url,
    resolve_config,
)
from companion.models.errors import ModelSetupError
from companion.models.exchanges import (
    answer,
    call_args,
    chat,
    feedback,
    nudge,
    output_of,
    retry,
    text_of,
)
from companion.models.failures import FormRefused, explain
from companion.models.prompts import (
    HISTORY_LIMIT,
    Turns,
    params_prompt,
    speak_prompt,
    speaker_turns,
    states_prompt,
)
from companion.models.sdks import SdkClient, load_sdk
from companion.models.second_try import fresh_seed, own_line, task_after_refusal
from companion.models.servers import (
    LOCAL_SERVERS,
    SERVERS_WITHOUT_STREAM_USAGE,
    EndpointMemory,
    SpeakForm,
    StructuredForm,
    identify_server,
    props_url,
    shared_memory,
    slots_of,
)
from companion.models.session import SPEAK_TOKENS, Session
from companion.models.speakturn import SpeakTurn, shown_to
from companion.models.streaming import ended_early, whole_sentences, with_line
from companion.models.structured import (
    PARAMS_TOOL,
    STATES_TOOL,
    Problems,
    check_params,
    check_states,
    params_schema_problems,
    parse_text_tool_calls,
    speech_args,
    spoken_text,
    states_schema,
    wire_tool_names,
)
from companion.models.window import HistoryWindow
from companion.protocol import Message
from companion.text import clip

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "LOCAL_PLACEHOLDER_KEY",
    "LOCAL_REQUEST_TIMEOUT",
    "ModelSetupError",
    "ProviderConfig",
    "ProviderKind",
    "ProviderModel",
    "is_loopback_url",
    "resolve_config",
]

_log = logging.getLogger(__name__)

_CLOSE_TIMEOUT: Final = 5.0
PROPS_TIMEOUT: Final = 3.0
"""Seconds the start-up check waits for a llama.cpp server's ``/props`` (its slots) once its model
list came: a late answer leaves the slots untold, it does not fail the check."""
_T = TypeVar("_T")
_R = TypeVar("_R", StatesRequest, ParamsRequest, SpeakRequest)


_COMMON_ERRORS: Final = (ModelAPIError, UnexpectedModelBehavior, httpx2.HTTPError)


LOCAL_REQUEST_TIMEOUT: Final = 120.0
"""The least per-request deadline for a local server. Measured with SmolLM2-135M behind
llama-cpp-python on 2 loaded cores: 5-87 s a request, and 60 s cut two requests in ten."""


_NAMED: Final = ModelSettings(tool_choice=ToolOrOutput(function_tools=[]))
"""With exactly one output tool and no text allowed, pydantic-ai sends a ``tool_choice`` that names
that tool (not ``"required"``, which some servers ignore)."""


def _structured_request(
    form: StructuredForm, tool: ToolDefinition
) -> tuple[ModelRequestParameters, ModelSettings | None]:
    """The request parameters of one structured form (see :mod:`companion.models.servers`)."""
    if form == "named_tool":
        params = ModelRequestParameters(output_mode="tool", output_tools=[tool], allow_text_output=False)
        return params, _NAMED
    if form == "prompted":
        return ModelRequestParameters(output_mode="text", allow_text_output=True), None
    output = OutputObjectDefinition(
        json_schema=dict(tool.parameters_json_schema),
        name=tool.name,
        description=tool.description,
        strict=False,
    )
    if form == "json_schema":
        return ModelRequestParameters(output_mode="native", output_object=output), None
    # JSON mode; the schema is in the instructions (ours: pydantic-ai's template is turned off).
    params = ModelRequestParameters(
        output_mode="prompted", output_object=output, prompted_output_template=False
    )
    if form == "json_object_schema":
        fmt = {"type": "json_object", "schema": dict(tool.parameters_json_schema)}
        return params, ModelSettings(extra_body={"response_format": fmt})
    return params, None


class ProviderModel:
    """A :class:`~companion.models.base.CompanionModel` backed by a real provider via pydantic-ai.

    ``memory`` keeps what each endpoint accepts (by default shared by the whole process, so a
    model made after the start-up check knows which server the check found).
    """

    streams_speech: bool = True
    """The speak request streams, shown to the request's live line (:mod:`.streaming`)."""

    def __init__(self, config: ProviderConfig, memory: EndpointMemory | None = None) -> None:
        self.config = config
        self.memory = shared_memory() if memory is None else memory
        self.sdk = load_sdk(config.kind)
        """The provider's SDK (only its own is imported)."""
        self.errors: tuple[type[Exception], ...] = (*_COMMON_ERRORS, *self.sdk.errors)
        """What a failed request raises, for the SDK and transport in use."""
        self._ssl: ssl.SSLContext | None = None
        self.tokens: Counter[str] = Counter()
        """Tokens the server reported so far: ``input`` and ``output`` (the metrics read it)."""
        self.requests_without_usage = 0
        """Answered requests whose server reported no tokens (:mod:`.usage`): :attr:`tokens`
        leaves them out rather than counting them as 0."""
        self._window = HistoryWindow(HISTORY_LIMIT)
        """The earlier messages each prompt quotes, moved in steps for the server's cache."""

    @property
    def name(self) -> str:
        return f"{self.config.kind}:{self.config.model_name}"

    @property
    def server(self) -> str:
        """Which server this endpoint is, as far as known (e.g. ``llama-cpp-python``)."""
        return self.memory.state(self.config).server

    @property
    def serial(self) -> bool:
        """The endpoint answers one request at a time (:data:`~.servers.SERIAL_SERVERS`, or a
        llama.cpp server with one slot, as the start-up check found it): requests sent side by
        side only queue there, so the engine sends the ones before the first words one after
        another, and no more of them."""
        return self.memory.state(self.config).serial

    @property
    def parallel_params(self) -> bool:
        """The engine fills this companion's parameters as soon as a message opens a turn for it,
        beside the leader's states call (:meth:`companion.engine.speech.Speaker.prefetch`): one
        request more for each addressed companion that does not speak, one request less one after
        the other before the first words (states, then speak, instead of states, parameters,
        then speak). Not on a :attr:`serial` endpoint, where they would queue ahead of the
        speaker's."""
        return not self.serial

    @property
    def speculates(self) -> bool:
        """The likely speaker starts its speak request while the leader decides
        (:meth:`companion.engine.speech.Speaker.prepare`): held, and cancelled when another
        companion speaks, so the first words wait for one request, not two one after the other.
        Not on a :attr:`serial` endpoint: there the prepared speech was often written whole
        before the states answer confirmed it, so the first words came with the whole line."""
        return not self.serial

    @property
    def works_ahead(self) -> bool:
        """The next turn's model work starts from a preview, while the line before is still
        voiced (:mod:`companion.conversation.preview`): the leader's states call and the likely
        speaker's reply, held. On every endpoint, a :attr:`serial` one too: while a line is
        heard nothing else of the conversation asks the server, so the requests sent then wait
        for nobody (their parameters first, then speech, one after the other)."""
        return True

    @property
    def states_for_one(self) -> bool:
        """The leader asks this model for the states of a message that addresses it alone. With
        one addressee the rules already make it the speaker (a model that says everybody listens
        is overruled, :func:`~.structured.check_states`); the model would only propose a closing
        stage, which the turn limits bring anyway. A :attr:`serial` endpoint is not asked: that
        request would come before the speaker's two (parameters, then speak)."""
        return not self.serial

    @property
    def request_timeout(self) -> float:
        """Seconds one HTTP request may take: the configured deadline, at least
        :data:`LOCAL_REQUEST_TIMEOUT` for a server of :data:`~.servers.LOCAL_SERVERS` (a request
        it has begun is computed to its end even when the client gives up, so giving up early
        only makes the next request wait)."""
        if self.server in LOCAL_SERVERS:
            return max(self.config.request_timeout, LOCAL_REQUEST_TIMEOUT)
        return self.config.request_timeout

    def __repr__(self) -> str:
        return f"ProviderModel({self.name!r}, endpoint={self.config.endpoint!r})"

    def error(self, purpose: str, detail: str, reason: str) -> ModelError:
        """A :class:`ModelError` for this model: full ``detail`` in the message, ``reason`` short."""
        return ModelError(f"{self.name} ({purpose}): {detail}", reason=reason)

    # --- connections -------------------------------------------------------------------------

    def _client(self) -> SdkClient:
        """A fresh SDK client: no SDK retries, no proxy for loopback endpoints."""
        c = self.config
        local = c.base_url is not None and is_loopback_url(c.base_url)
        if self._ssl is None:  # loading the CA store costs ~70 ms: once per model, not per call
            self._ssl = httpx2.create_ssl_context(trust_env=not local)
        http = httpx2.AsyncClient(
            verify=self._ssl, trust_env=not local, timeout=self.request_timeout + _CLOSE_TIMEOUT
        )
        return self.sdk.make_client(c, http, self.request_timeout + _CLOSE_TIMEOUT)

    @asynccontextmanager
    async def _open_client(self) -> AsyncIterator[SdkClient]:
        async with asyncio_loop():
            client = self._client()
            try:
                yield client
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                    await run_asyncio(client.close)

    @asynccontextmanager
    async def _session(self, purpose: str) -> AsyncIterator[Session]:
        async with self._open_client() as client:
            ends_at_finish = self.server in SERVERS_WITHOUT_STREAM_USAGE
            yield Session(self, self.sdk.make_model(client, self.config, ends_at_finish), purpose)

    # --- start-up check ----------------------------------------------------------------------

    async def check(self, *, timeout: float = 10.0) -> None:
        """Fail now, with a clear :class:`ModelSetupError`, if the model cannot be used.

        Lists the endpoint's models (no tokens spent): proves the endpoint answers, the key is
        accepted and, for OpenAI-compatible servers, that the model is served. The list also
        tells which server it is (llama.cpp, llama-cpp-python, Ollama, vLLM, LM Studio), so the
        first request already has the form that server accepts; a llama.cpp server is asked its
        slots too (:attr:`serial` with one).
        """
        c = self.config
        try:
            async with self._open_client() as client:
                with trio.fail_after(timeout):
                    listed = await run_asyncio(self.sdk.list_models, client)
                server = identify_server(c, listed)
                slots = await self._slots(client, server, min(timeout, PROPS_TIMEOUT))
        except trio.TooSlowError as exc:
            raise ModelSetupError(
                f"{self.name}: {c.endpoint} did not answer within {timeout:g} s",
                reason=f"{c.endpoint} did not answer within {timeout:g} s",
            ) from exc
        except self.errors as exc:
            detail, reason = explain(exc, c, self.sdk)
            raise ModelSetupError(f"{self.name}: {detail}", reason=reason) from exc
        ids = [m.id for m in listed]
        self.memory.identify(c, server)
        if slots is not None:
            self.memory.count_slots(c, slots)
        served = _serves(ids, c.model_name)
        log_event(
            _log,
            "model_checked",
            model=self.name,
            endpoint=c.endpoint,
            listed=len(ids),
            served=served,
            server=self.server,
            slots=slots,
        )
        if served:
            return
        if c.kind == "anthropic":
            # Aliases (claude-...-latest) work without being listed; let the first call decide.
            log_event(_log, "model_not_listed", logging.WARNING, model=self.name, endpoint=c.endpoint)
            return
        shown = ", ".join(ids[:20]) + (" …" if len(ids) > 20 else "")
        raise ModelSetupError(
            f"{self.name}: {c.endpoint} does not serve {c.model_name!r}; it serves: {shown or 'nothing'}. "
            f"Use one of those (--model openai:NAME), or make the server load it (Ollama: ollama pull "
            f"{c.model_name}).",
            reason=f"{c.endpoint} does not serve {c.model_name!r}",
        )

    async def _slots(self, client: SdkClient, server: str, timeout: float) -> int | None:
        """How many requests a llama.cpp endpoint computes at once (its ``/props``), within
        ``timeout`` seconds; ``None`` for another server, or when the answer is late, refused or
        tells no number (then it is taken as one that answers side by side, as before it
        could tell)."""
        c = self.config
        if server != "llama.cpp" or c.base_url is None or self.sdk.read_json is None:
            return None
        url = props_url(c.base_url)
        unread: tuple[type[Exception], ...] = (*self.errors, ValueError)  # refused, or not JSON
        why = f"no answer in {timeout:g} s"
        with trio.move_on_after(timeout):
            try:
                return slots_of(await run_asyncio(self.sdk.read_json, client, url))
            except unread as exc:
                why = clip(f"{type(exc).__name__}: {exc}", 200)
        log_event(_log, "model_props_unread", endpoint=c.endpoint, url=url, why=why)
        return None

    # --- the three calls ---------------------------------------------------------------------

    def _in_window(self, key: str, request: _R) -> _R:
        """``request`` with only the earlier messages its prompt quotes (:mod:`.window`): the
        leader's window (``key`` ``"leader"``), and each speaker's (:func:`_speaker_window`), shared
        by its parameters and speak calls."""
        quoted: list[Message] = self._window.quoted(key, request.history, request.message)
        return replace(request, history=[*quoted, request.message])

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        """All addressed companions' states in one structured call."""
        if not request.companions:
            return []
        request = self._in_window("leader", request)
        tool = ToolDefinition(
            name=STATES_TOOL,
            parameters_json_schema=states_schema([c.id for c in request.companions]),
            description="Record the next-turn state of every companion listed.",
            kind="output",
        )

        def prompt(as_json: bool) -> tuple[str, str]:
            return states_prompt(request, STATES_TOOL, tool.parameters_json_schema if as_json else None)

        return await self._structured("states", prompt, tool, lambda raw: check_states(raw, request))

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        """The card's ``events.params`` values, validated against its JSON Schema."""
        problems = params_schema_problems(request.schema)
        if problems is not None:
            raise self.error("params", str(problems), str(problems))
        key = _speaker_window(request.me.id)
        request = self._in_window(key, request)
        tool = ToolDefinition(
            name=PARAMS_TOOL,
            parameters_json_schema=dict(request.schema),
            description="Record your assessment of the situation.",
            kind="output",
            strict=False,
        )

        # the speak call's instructions, in the form it will take (the first this server takes)
        text_reply = self.memory.speak_forms(self.config)[0] == "text"

        def prompt(as_json: bool) -> tuple[str, str]:
            return params_prompt(request, PARAMS_TOOL, as_json, text_reply)

        def check(raw: Mapping[str, Any]) -> dict[str, Any] | Problems:
            return check_params(raw, request.schema)

        asked = self._window.asked(key)
        turns = speaker_turns(request.me, request.history, request.message, asked=asked)[0]
        return await self._structured("params", prompt, tool, check, turns)

    async def _structured(
        self,
        purpose: str,
        prompt: Callable[[bool], tuple[str, str]],
        tool: ToolDefinition,
        check: Callable[[Mapping[str, Any]], _T | Problems],
        turns: Turns = (),
    ) -> _T:
        """The structured answer, in the first form the endpoint accepts and honours, after the
        conversation's earlier ``turns`` (the speaker's, :func:`~.prompts.speaker_turns`).

        A form refused with an HTTP error, or whose forcing was ignored (text without JSON came
        back), is remembered and the next form is tried at once. An answer that fails its check
        goes back once with its problems; a second failure is a :class:`ModelError`.
        """
        config = self.config
        forms = self.memory.structured_forms(config)
        refusals: list[tuple[str, FormRefused]] = []
        ignored: list[str] = []
        async with self._session(purpose) as session:
            for index, form in enumerate(forms):
                instructions, text = prompt(form != "named_tool")
                params, settings = _structured_request(form, tool)
                messages = chat(turns, text, instructions)
                try:
                    response = await session.request(messages, params, settings, form=form, may_refuse=True)
                except FormRefused as refusal:
                    self.memory.refused(config, form, str(refusal))
                    refusals.append((form, refusal))
                    continue
                call, raw = output_of(response, tool.name)
                forcing = form != "prompted"
                cut = response.finish_reason == "length"
                if cut:
                    self._cut(purpose, form, response)
                elif forcing and call is None and text_of(response) and (form == "named_tool" or raw is None):
                    # Text where a tool call was forced, or no JSON where JSON was: ignored.
                    self.memory.ignored(config, form)
                    ignored.append(form)
                    if raw is None and index < len(forms) - 1:
                        continue
                result = self._checked(purpose, check, call, raw, tool.name, attempt=1)
                if isinstance(result, Problems):
                    if not cut:
                        messages += [response, feedback(response, call, result, instructions)]
                    # an answer cut at the token limit is asked again afresh: sent back, its
                    # hundreds of looping tokens would only be read again before the retry
                    second = await session.request(messages, params, settings, form=form)
                    call, raw = output_of(second, tool.name)
                    result = self._checked(purpose, check, call, raw, tool.name, attempt=2)
                    if isinstance(result, Problems):
                        raise self.error(
                            purpose,
                            f"invalid answer after a retry: {result}",
                            f"the model's {purpose} answer was invalid twice ({clip(result.items[0], 80)})",
                        )
                self.memory.worked(config, "structured", form)
                return result
        raise self._all_refused(purpose, refusals)

    def _cut(self, purpose: str, form: str, response: ModelResponse) -> None:
        """A structured answer ran to the token limit: the model looped inside the grammar or
        the form (SmolLM2 behind llama.cpp's server listed the same food in an array of strings
        until its 600 tokens ran out, 11-14 s, measured). That is the model's answer, not the
        server ignoring the form: the form is kept, and the answer is asked for again."""
        log_event(
            _log,
            "model_answer_cut",
            logging.WARNING,
            model=self.name,
            purpose=purpose,
            form=form,
            output_tokens=response.usage.output_tokens or None,
        )

    def _all_refused(self, purpose: str, refusals: Sequence[tuple[str, FormRefused]]) -> ModelError:
        """Every form failed with an HTTP error: the server's fault, not the forms' (so their
        refusals are forgotten), reported with the server's last words."""
        self.memory.forgive(self.config, [f for f, _ in refusals])
        last = refusals[-1][1]
        tried = ", ".join(f for f, _ in refusals)
        label = self.memory.label(self.config)
        every = " to every request form" if len(refusals) > 1 else ""
        return self.error(
            purpose,
            f"{self.config.endpoint} ({label}) answered HTTP {last.status}{every} ({tried}): {last.words}",
            f"the server answered HTTP {last.status}{every}: {clip(last.words, 80)}",
        )

    def _checked(
        self,
        purpose: str,
        check: Callable[[Mapping[str, Any]], _T | Problems],
        call: ToolCallPart | None,
        raw: dict[str, Any] | None,
        tool_name: str,
        attempt: int,
    ) -> _T | Problems:
        if raw is not None:
            result = check(raw)
        elif call is not None:
            result = Problems((f"the {tool_name} arguments were not a JSON object",))
        else:
            result = Problems(("the answer held no JSON object: answer with one JSON object as asked",))
        if isinstance(result, Problems):
            log_event(
                _log,
                "model_output_refused",
                logging.WARNING,
                model=self.name,
                purpose=purpose,
                attempt=attempt,
                problems=list(result.items),
            )
        return result

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        """Run the speaker's turn; every tool call goes through ``call_tool``.

        The first speaking form the endpoint accepts is used (tools with ``"required"``, with
        ``"auto"``, or none). A plain-text answer is the line said, through the card's speaking
        tool (so the runtime's checks apply); a tool call written as text is run as a tool call.
        A turn in which nothing was done ends in a :class:`ModelError` that says why.
        """
        tools = wire_tool_names(request.tools)
        if not any(spec.kind == "action" for spec in tools.values()):
            log_event(_log, "speak_skipped", logging.WARNING, model=self.name, reason="no action tools")
            return
        config = self.config
        forms = self.memory.speak_forms(config)
        turn = SpeakTurn(tools, request)
        refusals: list[tuple[str, FormRefused]] = []
        async with self._session("speak") as session:
            for index, form in enumerate(forms):
                if turn.answers >= config.max_speak_requests:
                    break
                try:
                    await self._speak_in(
                        form, session, request, turn, call_tool, last=index == len(forms) - 1
                    )
                except FormRefused as refusal:
                    self.memory.refused(config, form, str(refusal))
                    refusals.append((form, refusal))
                    continue
                if turn.done:
                    self.memory.worked(config, "speak", form)
                    if turn.pending:
                        log_event(
                            _log,
                            "speak_budget_spent",
                            logging.WARNING,
                            model=self.name,
                            requests=turn.answers,
                            acted=sorted(turn.done),
                            unused_instructed=sorted(turn.pending),
                        )
                    return
                if not turn.switch_form:
                    break
                turn.switch_form = False
        if turn.answers == 0 and refusals:
            raise self._all_refused("speak", refusals)
        raise self.error(
            "speak",
            f"nothing said after {turn.answers} answer(s): {turn.problem}",
            f"the model did not speak ({turn.problem})",
        )

    async def _speak_in(
        self,
        form: SpeakForm,
        session: Session,
        request: SpeakRequest,
        turn: SpeakTurn,
        call_tool: ToolCaller,
        *,
        last: bool,
    ) -> None:
        """The speaking turn in one form, within the turn's request budget."""
        text_reply = form == "text"
        turn.start_form(text_reply)
        # the prompt's history only: the card's own line, if it comes to that, reads it all
        key = _speaker_window(request.me.id)
        quoting = self._in_window(key, request)
        instructions, prompt = speak_prompt(quoting, turn.tools, text_reply)
        # What the model must not echo as its line: the persona and the turn's own lines (not the
        # history, whose numbered lines spoken_text skips, nor the context, where an earlier line
        # may fairly come back).
        own = [line for line in prompt.splitlines() if not line.startswith("Context:")]
        turn.prompt = "\n".join([instructions, *own])
        definitions = [
            ToolDefinition(
                name=name,
                parameters_json_schema=dict(spec.input_schema),
                description=spec.description,
                strict=False,
            )
            for name, spec in turn.tools.items()
        ]
        if text_reply:
            params = ModelRequestParameters(output_mode="text", allow_text_output=True)
        else:
            params = ModelRequestParameters(
                function_tools=definitions, allow_text_output=form == "tools_auto"
            )
        turns, heard = speaker_turns(
            quoting.me, quoting.history, quoting.message, asked=self._window.asked(key)
        )
        self._window.ask(key, heard, prompt)  # the next turn quotes it before this line
        messages = chat(turns, prompt, instructions)
        first = True
        partial = shown_to(request, turn, form)
        settings: ModelSettings | None = None
        while turn.answers < self.config.max_speak_requests:
            response = await session.request(
                messages, params, settings, form=form, may_refuse=first, partial=partial
            )
            stopped = partial is not None and partial.stopped
            ended = ended_early(response)
            if partial is not None and partial.settled is not None:
                # the heard line, from the answer as it was cut (its arguments half written)
                response, cut = with_line(response, partial.settled, turn.speech_args), False
            else:
                response, cut = whole_sentences(response, stopped=stopped)
            if cut and not stopped:
                if ended:
                    log_event(
                        _log, "line_cut_stream_ended", logging.WARNING, model=self.name, server=self.server
                    )
                else:
                    log_event(_log, "line_cut_at_token_limit", model=self.name, limit=SPEAK_TOKENS)
            first = False
            turn.answers += 1
            speaker = turn.speaking_tool()
            refused = None if partial is None else partial.refused
            if refused is not None and speaker is not None and speaker[1].id not in turn.done:
                # Refused at its first sentence, nothing heard: a refused line. Made as a call it
                # said nothing, went back as a follow-up, and a clause-only answer after it counted
                # as an empty one: no line at all (SmolLM2-135M, measured).
                turn.new_round()
                turn.not_said(refused)
                returns: list[ModelRequestPart] = []
            else:
                called = any(isinstance(p, ToolCallPart) for p in response.parts)
                said = text_of(response)
                if form == "tools_required" and not called:
                    self.memory.ignored(self.config, form)
                if not called and not said and not text_reply and not last and not turn.done:
                    # Neither a call nor a word: with these tools this server and model give nothing.
                    self.memory.ignored(self.config, form)
                    turn.failed("an empty answer")
                    turn.switch_form = True
                    return
                returns = await self._run_calls(response, turn, call_tool)
                speaker = turn.speaking_tool()
            if turn.line_refused and speaker is not None and speaker[1].id not in turn.done:
                # A refused line is asked for again fresh, never as a follow-up (see second_try).
                if turn.lines_refused >= 2 or turn.answers >= self.config.max_speak_requests:
                    await self._own_line(request, turn, speaker[1], call_tool)
                    return
                fresh = task_after_refusal(prompt, turn.line_refused, request.me.name)
                messages = chat(turns, fresh, instructions)
                settings = ModelSettings(seed=fresh_seed(request.message.params.id))
                continue
            if not turn.follow_up():
                return
            messages += [response, ModelRequest(parts=returns, instructions=instructions)]

    async def _own_line(
        self, request: SpeakRequest, turn: SpeakTurn, spec: ToolSpec, call_tool: ToolCaller
    ) -> None:
        """A line of the card's own through ``spec`` (:func:`.second_try.own_line`), recorded as
        the turn's own calls are."""

        async def recorded(tool_id: str, args: Mapping[str, Any]) -> Mapping[str, Any]:
            result = dict(await call_tool(tool_id, args))
            turn.record(spec, result.get("status", "ok") == "ok", str(result.get("message", "")))
            return result

        await own_line(request, recorded, spec.id, self.name)

    async def _run_calls(
        self, response: ModelResponse, turn: SpeakTurn, call_tool: ToolCaller
    ) -> list[ModelRequestPart]:
        """Execute the response's tool calls in order; answer each one for the next request.

        A response without tool calls is read as text: a tool call written out is run, any other
        text is the line said through the speaking tool, an empty answer is sent back.
        """
        turn.new_round()
        calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
        if not calls:
            return [await self._run_text(text_of(response), turn, call_tool)]
        returns: list[ModelRequestPart] = []
        for call in calls:
            spec = turn.tools.get(call.tool_name)
            args = call_args(call)
            if spec is None or args is None:
                turn.failed(
                    f"it called an unknown tool {call.tool_name!r}"
                    if spec is None
                    else f"the {call.tool_name} arguments were not a JSON object"
                )
                known = ", ".join(turn.tools)
                why = (
                    f"there is no tool {call.tool_name!r}; use one of: {known}"
                    if spec is None
                    else ("the arguments are not a JSON object")
                )
                returns.append(retry(call, why))
                continue
            result = await self._run_one(spec, args, turn, call_tool)
            returns.append(answer(call, result, result.get("status", "ok") == "ok"))
        return returns

    async def _run_one(
        self, spec: ToolSpec, args: Mapping[str, Any], turn: SpeakTurn, call_tool: ToolCaller
    ) -> dict[str, Any]:
        if spec.id in turn.done:
            log_event(_log, "speak_repeat_refused", model=self.name, tool=spec.id)
            return {"status": "refused", "message": "already done this turn"}
        result = dict(await call_tool(spec.id, args))
        ok = result.get("status", "ok") == "ok"
        turn.record(spec, ok, str(result.get("message", result.get("status", ""))))
        return result

    async def _run_text(self, text: str, turn: SpeakTurn, call_tool: ToolCaller) -> ModelRequestPart:
        """A text answer: written-out tool calls, else the line said; the feedback for a follow-up."""
        written = parse_text_tool_calls(text, turn.tools)
        if written:
            results = []
            for name, given in written:
                results.append(
                    {"tool": name, **await self._run_one(turn.tools[name], given, turn, call_tool)}
                )
            return UserPromptPart(
                f"Results of your tool calls: {json.dumps(results, ensure_ascii=False, default=str)}"
            )
        line = spoken_text(text, (turn.me.name, turn.me.id), turn.prompt)
        speaker = turn.speaking_tool()
        if line and speaker is not None and speaker[1].id not in turn.done:
            name, spec = speaker
            said = speech_args(spec, line, turn.recipients)
            assert said is not None  # speaking_tool only offers tools that take a message
            log_event(_log, "speak_text_as_tool", model=self.name, tool=spec.id, text=clip(line, 200))
            result = await self._run_one(spec, said, turn, call_tool)
            if result.get("status", "ok") == "ok":
                return UserPromptPart(f"You said that through {name}.")
            return UserPromptPart(
                # In words, not JSON: a small model reads a JSON block aloud as its next line.
                f"What you said could not be delivered: {result.get('message') or result.get('status')}"
            )
        log_event(_log, "speak_without_tool", logging.WARNING, model=self.name, text=clip(text, 200))
        if text and not line and speaker is not None and speaker[1].id not in turn.done:
            # Words, but none to say (the prompt's record continued): asked again fresh, as a
            # refused line is; a follow-up's framing was read aloud as the next line (measured).
            turn.not_said(f"{NOT_SAID} is not words said out loud")
        if not turn.done:
            turn.failed("an empty answer" if not line else "a text answer and no tool to say it with")
        names = ", ".join(n for n, s in turn.tools.items() if s.kind == "action")
        words = (
            "You said nothing. Say your line now."
            if turn.text_reply
            else f"Nobody heard that: use an action tool ({names}) to talk or act."
        )
        return nudge(words)


def _speaker_window(companion_id: str) -> str:
    """The key of a speaker's history window (:class:`~.window.HistoryWindow`): one for its
    parameters and speak calls, so both quote the same messages and share a cached prefix."""
    return f"speaker {companion_id}"


def _serves(ids: Sequence[str], name: str) -> bool:
    """Whether ``name`` is listed; Ollama lists ``NAME:latest`` for a plain ``NAME``."""
    return name in ids or f"{name}:latest" in ids
