"""The offline default model: deterministic lines in character that follow the card, no network.

:class:`ScriptedModel` is not a language model, but it plays one well enough for a card author
to see their card work offline, in tests and in the demo:

- **states**: whoever the last message named, or is nominated, is selected; the companion
  whose story relates most to the message is keenest to speak; someone always speaks; after a
  number of replies drawn from the opening line the leader proposes ``pre-closing`` so the
  conversation winds down to ``terminal`` by itself. States depend on the conversation only,
  not on the leader's seed, so it does not matter which node leads.
- **parameters**: every property of the card's ``events.params`` schema is inferred from the
  words of the message (:mod:`.inference`), so ``weather_mentioned`` is true for "Looks like
  rain tonight" and the card's conditions fire when they should.
- **speaking**: it calls the tools the matched instructions name, in order: knowledge tools
  first, then other actions (custom ``@action`` tools included, with input built from their
  JSON Schema and the message; numbers bound to their own words, "two six-sided dice" is
  ``count`` 2 and ``sides`` 6), then exactly one speaking tool. The line (:mod:`.phrasing`)
  says what the knowledge tools found, reacts to what was said, answers a question from the
  companion's story, does what the instruction asks, in the language of the message, never
  repeating the companion's own earlier lines, and is addressed to the previous speaker and the
  others present, never to the companion itself. Its emotion follows the message's feeling
  ("I feel sad" is answered ``sad``, never ``happy``).

Every choice comes from a generator seeded with ``seed`` and the *content* of the request (never
message ids or the clock), hashed with SHA-256, so the same seed and the same conversation give
the same lines on every run, whatever the text holds (lone surrogates included).
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from companion.conversation.rules import bigram_jaccard, turn_info
from companion.lines.check import NOT_SAID, LineContext, check_said
from companion.log import log_event
from companion.models.base import (
    ModelError,
    ParamsRequest,
    SpeakRequest,
    StateDecision,
    StatesRequest,
    ToolCaller,
    ToolSpec,
)
from companion.models.hearing import asks, hear
from companion.models.inference import Clues, fill_schema
from companion.models.lexicon import STOPWORDS, clean, concepts_in, cue_concepts, quantity, words
from companion.models.persona import Persona, persona_of
from companion.models.phrasing import compose, plan_of
from companion.protocol import ClosingStage, Message, Metadata

__all__ = ["ScriptedModel"]

logger = logging.getLogger("companion.models.scripted")

_SPEAKING_TOOLS: Final = ("speak", "speak_with_voice")
_HISTORY_READ: Final = 4
"""How many recent messages the parameters look at (e.g. foods named "in the last few messages")."""
_ATTEMPTS: Final = 6
"""Lines composed per turn at most, to find one unlike the companion's own recent lines."""
_SIMILAR: Final = 0.6
_MAX_LINE: Final = 600


def _asked(text: str, companion: Metadata) -> bool:
    """Whether a question in ``text`` names ``companion`` (that is how a line passes the turn)."""
    return asks(text, companion.name) or asks(text, companion.id)


class ScriptedModel:
    """A deterministic stand-in for a language model (offline, in character, for demos and tests).

    ``min_replies``..``max_replies`` bound the conversation length after which the leader
    proposes ``pre-closing``. The default of at most 8 keeps the goodbye (``closing``, one reply
    later) inside the shortest turn limit of the shipped cards (``max_turns: 10``), whichever
    companion leads the last turns.
    """

    def __init__(self, seed: int = 0, *, min_replies: int = 6, max_replies: int = 8) -> None:
        if not 1 <= min_replies <= max_replies:
            raise ValueError(f"need 1 <= min_replies <= max_replies, got {min_replies}, {max_replies}")
        self.seed = seed
        self._min_replies = min_replies
        self._max_replies = max_replies

    @property
    def name(self) -> str:
        return f"scripted(seed={self.seed})"

    def _rng(self, *parts: object, shared: bool = False) -> random.Random:
        """A generator for one decision: the seed (unless ``shared``) and the request's content,
        hashed (stable across processes and PYTHONHASHSEED; lone surrogates are hashed, not
        refused)."""
        key = "\x1f".join(["shared" if shared else str(self.seed), *map(str, parts)])
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        return random.Random(int.from_bytes(digest[:16], "big"))

    def conversation_length(self, first: Message | None) -> int:
        """How many replies a conversation runs before the leader proposes to close.

        Like the states, it depends on the conversation alone, not on this model's seed: whichever
        companion leads a turn (the engine picks by message id) decides the same, so a demo run
        depends on the seeds and the opening line only.
        """
        key = "" if first is None else first.params.message
        return self._rng("length", key, shared=True).randint(self._min_replies, self._max_replies)

    # --- states ------------------------------------------------------------------------------

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        message = request.message
        text = clean(message.params.message)
        length = self.conversation_length(request.history[0] if request.history else message)
        closing: ClosingStage = "pre-closing" if request.turn + 1 >= length else "none"
        named = [c.id for c in request.companions if _asked(text, c)]
        out: list[StateDecision] = []
        for companion in request.companions:
            rng = self._rng("state", companion.id, message.params.from_, text, request.turn, shared=True)
            relevance = min(persona_of(companion).relevance(text), 2.5)
            wants = rng.random() < 0.65 or relevance >= 2.0
            importance = min(10.0, float(rng.randint(1, 6)) + 1.6 * relevance)
            selected = companion.id == request.nominated or (
                request.nominated is None and companion.id in named
            )
            if selected:
                wants, importance = True, max(importance, 8.0)
            out.append(
                StateDecision(companion.id, "speak" if wants else "listen", importance, selected, closing)
            )
        if out and not any(d.state == "speak" for d in out):
            # Someone always has something to say: a silent round would end the conversation
            # without a goodbye.
            pick = self._rng("keen", text, request.turn, shared=True).randrange(len(out))
            d = out[pick]
            out[pick] = StateDecision(d.companion_id, "speak", max(d.importance, 5.0), d.selected, closing)
        return out

    # --- parameters --------------------------------------------------------------------------

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        clues = self._clues(request.me, request.role, request.message, request.history)
        rng = self._rng("params", request.me.id, clues.text, len(request.history))
        value = fill_schema(request.schema, clues, rng)
        return value if isinstance(value, dict) else {}

    def _clues(
        self,
        me: Metadata,
        role: str,
        message: Message,
        history: Sequence[Message],
        *,
        recipients: Sequence[str] = (),
        hint: str = "",
        tool_input: bool = False,
    ) -> Clues:
        sender = message.params.from_
        recent = [
            clean(m.params.message, 1000)
            for m in history[-_HISTORY_READ:]
            if m.params.id != message.params.id and m.params.from_ != me.id  # what others said
        ]
        text = clean(message.params.message)
        return Clues(
            text=text,
            recent=(*recent, text),
            sender=sender,
            me=me.id,
            recipients=tuple(recipients),
            spoken=any(m.params.from_ == me.id for m in history),
            met=any(m.params.from_ == me.id and sender in m.params.to for m in history),
            closing=turn_info(message).closing,
            hint=clean(hint, 1000),
            persona=clean(f"{me.personality} {role}", 2000),
            tool_input=tool_input,
        )

    # --- speaking ----------------------------------------------------------------------------

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        me = request.me
        tools = {t.id: t for t in request.tools}
        names = _names(request.extra.get("names"))
        called: set[str] = set()
        failed: list[str] = []
        learned: list[tuple[str, Any]] = []
        for instruction in request.instructions:  # knowledge first: what it learns shapes the line
            spec = tools.get(instruction.tool)
            if spec is None or spec.kind != "knowledge" or spec.id in called:
                continue
            called.add(spec.id)
            result = await self._call(spec, request, instruction.instruction, call_tool)
            if result.get("status") == "ok":
                found = _names(result.get("output"))
                names.update({k: v for k, v in found.items() if k not in names})
                if not found:  # not a list of who is here: something to say
                    learned.append((spec.id, result.get("output")))
        speaking = self._speaking_tool(request, tools)
        for instruction in request.instructions:  # then the other actions the card asks for
            spec = tools.get(instruction.tool)
            if spec is None:
                log_event(
                    logger, "scripted_tool_unknown", logging.WARNING, companion=me.id, tool=instruction.tool
                )
                continue
            if spec.kind != "action" or spec is speaking or spec.id in called or _speaks(spec):
                continue
            called.add(spec.id)
            result = await self._call(spec, request, instruction.instruction, call_tool)
            if result.get("status") != "ok":
                failed.append(spec.description or spec.id)
        if speaking is None:
            raise ModelError(
                f"{self.name}: no tool to speak with (tools: {', '.join(tools) or 'none'}); "
                "give the card a speaking action such as 'speak'"
            )
        instruction_text = [i.instruction for i in request.instructions if i.tool == speaking.id] or [
            i.instruction for i in request.instructions
        ]
        text = self._line(request, names, instruction_text, failed, learned)
        result = await self._call(speaking, request, " ".join(instruction_text), call_tool, say=text)
        if str(result.get("message", "")).startswith(NOT_SAID):  # a copy of a line heard: one other
            again = self._line(request, names, instruction_text, failed, learned, avoid=[text])
            if again != text:
                await self._call(speaking, request, " ".join(instruction_text), call_tool, say=again)

    async def _call(
        self,
        spec: ToolSpec,
        request: SpeakRequest,
        instruction: str,
        call_tool: ToolCaller,
        *,
        say: str | None = None,
    ) -> Mapping[str, Any]:
        """Call an instructed tool with input inferred from its schema, the message and the
        instruction (``say`` is the line, for a speaking tool); once more with the schema's bare
        minimum if the input is refused. A failure is logged and the turn goes on."""
        arguments = self._arguments(spec, request, instruction, say)
        result = await call_tool(spec.id, arguments)
        if result.get("status") == "invalid_input":
            minimal = self._arguments(spec, request, instruction, say, minimal=True)
            if minimal != arguments:
                result = await call_tool(spec.id, minimal)
        if result.get("status") != "ok":
            log_event(
                logger,
                "scripted_tool_not_ok",
                logging.WARNING if say is not None else logging.INFO,
                companion=request.me.id,
                tool=spec.id,
                status=result.get("status"),
                detail=result.get("message"),
            )
        return result

    def _arguments(
        self,
        spec: ToolSpec,
        request: SpeakRequest,
        instruction: str,
        say: str | None,
        *,
        minimal: bool = False,
    ) -> dict[str, Any]:
        if say is None:
            return self._tool_input(spec, request, instruction if not minimal else "", minimal=minimal)
        return self._speak_input(spec, request, say, [instruction], minimal=minimal)

    def _tool_input(
        self, spec: ToolSpec, request: SpeakRequest, instruction: str, *, minimal: bool = False
    ) -> dict[str, Any]:
        schema = dict(spec.input_schema)
        schema.setdefault("type", "object")
        if minimal:
            schema = {
                **schema,
                "properties": {
                    k: v for k, v in schema.get("properties", {}).items() if k in schema.get("required", [])
                },
            }
        clues = self._clues(
            request.me,
            request.role,
            request.message,
            request.history,
            recipients=_recipients(request),
            hint=instruction,
            tool_input=True,
        )
        rng = self._rng("input", spec.id, request.me.id, clues.text, instruction)
        value = fill_schema(schema, clues, rng)
        if not isinstance(value, dict):
            return {}
        if not minimal:
            value.update(_written(schema, clues.text))
        return value

    def _speaking_tool(self, request: SpeakRequest, tools: Mapping[str, ToolSpec]) -> ToolSpec | None:
        for instruction in request.instructions:
            spec = tools.get(instruction.tool)
            if spec is not None and _speaks(spec):
                return spec
        for name in _SPEAKING_TOOLS:
            spec = tools.get(name)
            if spec is not None and _speaks(spec):
                return spec
        return next((spec for spec in tools.values() if _speaks(spec)), None)

    def _speak_input(
        self,
        tool: ToolSpec,
        request: SpeakRequest,
        text: str,
        instructions: Sequence[str],
        *,
        minimal: bool = False,
    ) -> dict[str, Any]:
        props: Mapping[str, Any] = tool.input_schema.get("properties", {})
        arguments = self._tool_input(tool, request, " ".join(instructions), minimal=minimal)
        arguments["message"] = text
        if "to" in props:
            arguments["to"] = _recipients(request)
        if "emotion" in props:
            options = _options(tool.input_schema, props["emotion"])
            if minimal:
                arguments["emotion"] = "neutral" if "neutral" in options or not options else options[0]
            else:
                mood = _mood(request, options)
                if mood is not None:
                    arguments["emotion"] = mood
        return arguments

    def _line(
        self,
        request: SpeakRequest,
        names: dict[str, str],
        instructions: Sequence[str],
        failed: Sequence[str],
        learned: Sequence[tuple[str, Any]] = (),
        avoid: Sequence[str] = (),
    ) -> str:
        """The reply: composed up to a few times until it is unlike my own lines so far and the
        lines to ``avoid`` (one the engine refused to say), whose facts count as told, and passes
        the engine's line check (:func:`~companion.lines.check.check_said`): a card's line
        refused after the model's two gives the slot up, and the person hears nothing (its
        "I've told you most of what I know about a tired friend." after "... a rainy morning.",
        SmolLM2-135M's fallback, measured)."""
        me = request.me
        message = request.message
        persona = persona_of(me, request.role)
        sender = message.params.from_
        text = clean(message.params.message)
        sender_name = names.get(sender) if sender != me.id and sender.startswith("companion_") else None
        before = [m for m in request.history if m.params.id != message.params.id]
        said = [*before, message]
        context = LineContext.of(said, me.id, {**names, me.id: me.name}, [request.role, *instructions])
        heard = hear(
            text,
            sender_name=sender_name,
            names=list(names.values()),
            me=persona,
            from_companion=sender.startswith("companion_"),
            context=clean(before[-1].params.message, 1000) if before else "",
        )
        params = request.extra.get("params")
        plan = plan_of(instructions, params if isinstance(params, Mapping) else None)
        mine = [clean(m.params.message) for m in request.history if m.params.from_ == me.id]
        mine += [clean(line) for line in avoid]
        folded = [line.casefold() for line in mine]
        used = [
            f.text
            for f in (*persona.facts, *persona.gist)
            if any(f.text.casefold().rstrip(".!。") in line for line in folded)
        ]
        candidates: list[tuple[bool, float, str]] = []
        for attempt in range(_ATTEMPTS):
            rng = self._rng("line", me.id, sender, text, len(request.history), attempt)
            line = compose(
                persona,
                heard,
                plan,
                rng=rng,
                closing=request.closing,
                ask_to=_ask_to(request, names, rng, persona),
                used=used,
                failed=failed,
                spoken=mine,
                heard_before=[clean(m.params.message) for m in request.history if m.params.from_ != me.id],
                sombre=_sombre_person(request),
                names=[*names.values(), persona.name],
                learned=learned,
            )[:_MAX_LINE]
            likeness = max((bigram_jaccard(line, old) for old in mine), default=0.0)
            refused = not check_said(line, context)[1].ok  # refused, or a sentence of it
            if likeness < _SIMILAR and line != text and not refused:
                return line
            candidates.append((refused, likeness, line))
        # none unlike them all: one the check passes, the least like any (the first was often a
        # line said before, which the engine refuses, and a card's own line refused gives the
        # slot up)
        return min(candidates, key=lambda candidate: candidate[:2])[2]


def _speaks(spec: ToolSpec) -> bool:
    return spec.kind == "action" and "message" in spec.input_schema.get("properties", {})


def _names(value: Any) -> dict[str, str]:
    """Display names by companion id, from ``extra["names"]`` or a ``companions`` answer."""
    out: dict[str, str] = {}
    if not isinstance(value, Mapping):
        return out
    for cid, entry in value.items():
        name = entry if isinstance(entry, str) else entry.get("name") if isinstance(entry, Mapping) else None
        if isinstance(cid, str) and isinstance(name, str) and clean(name):
            out[cid] = clean(name, 80)
    return out


def _recipients(request: SpeakRequest) -> list[str]:
    """Who the reply addresses: the engine's recipients (the previous speaker first), never me."""
    me = request.me.id
    out = [r for r in dict.fromkeys(request.recipients) if r != me]
    if not out and request.message.params.from_ != me:
        out = [request.message.params.from_]
    return out


def _ask_to(
    request: SpeakRequest, names: Mapping[str, str], rng: random.Random, persona: Persona
) -> str | None:
    """Someone present to ask a follow-up question: another companion than the previous speaker
    if there is one, else the previous speaker; never me."""
    me, sender = request.me.id, request.message.params.from_
    present = [r for r in _recipients(request) if r.startswith("companion_") and r in names and r != me]
    others = [r for r in present if r != sender]
    pool = others or present
    if not pool:
        return None
    name = names[rng.choice(pool)]
    return None if name.casefold() == persona.name.casefold() else name


_SOMBRE: Final = ("sad", "afraid", "wistful", "angry")
_GLAD: Final = ("happy", "proud", "excited", "amused", "surprised", "tender")
_LIKE: Final = {"afraid": "sad", "wistful": "sad", "proud": "happy", "excited": "happy", "amused": "happy"}


def _mood(request: SpeakRequest, options: Sequence[str]) -> str | None:
    """The emotion a reply shows, among ``options``: the feeling of the message it answers ("I
    feel sad" gets ``sad``, never ``happy``); with none, not a glad one while the person's last
    line was a sombre one; at the goodbye, a warm one. ``None`` leaves the inferred value."""
    sombre = _sombre_person(request)
    quiet = next((o for o in ("neutral", "calm", "tender") if o in options), None)
    if request.closing in ("closing", "terminal"):
        return quiet if sombre else "happy" if "happy" in options else None
    found = concepts_in(clean(request.message.params.message))
    feeling = next((f for f in (*_SOMBRE, *_GLAD) if found.get(f, 0) >= 1), None)
    from_companion = request.message.params.from_.startswith("companion_")
    if feeling is not None and not (sombre and from_companion and feeling in _GLAD):
        return _option_for(feeling, options)
    return quiet if sombre else None


def _sombre_person(request: SpeakRequest) -> bool:
    """Whether the person's last line in the conversation was sad, scared, wistful or cross."""
    person = next((m for m in reversed(request.history) if not m.params.from_.startswith("companion_")), None)
    if person is None:
        return False
    said = concepts_in(clean(person.params.message))
    return any(said.get(f, 0) >= 1 for f in _SOMBRE)


def _option_for(feeling: str, options: Sequence[str]) -> str | None:
    """The option that names ``feeling`` (or the feeling it is like: afraid is shown as sad)."""
    for wanted in (feeling, _LIKE.get(feeling)):
        for option in options:
            if wanted and wanted in {*concepts_in(option), *cue_concepts(option)}:
                return option
    return None


_NOT_MEANING: Final = frozenset({"how", "many", "much", "number", "value", "amount", "each", "has", "have"})


def _written(schema: Mapping[str, Any], text: str) -> dict[str, int | float]:
    """The numbers ``text`` writes for the schema's numeric properties ("roll two six-sided
    dice": ``count`` 2 and ``sides`` 6), each bound to its own words (:func:`.lexicon.quantity`),
    kept only within the property's bounds."""
    out: dict[str, int | float] = {}
    properties = schema.get("properties")
    for key, prop in properties.items() if isinstance(properties, Mapping) else ():
        if not isinstance(key, str) or not isinstance(prop, Mapping):
            continue
        kind = prop.get("type")
        if kind not in ("integer", "number"):
            continue
        about = re.sub(r"[_\-]+|(?<=[a-z])(?=[A-Z])", " ", key) + " " + str(prop.get("description", ""))
        meaning = [w for w in words(about) if w not in STOPWORDS and w not in _NOT_MEANING]
        found = quantity(text, meaning)
        if found is None or (kind == "integer" and not found.is_integer()):
            continue
        low, high = prop.get("minimum"), prop.get("maximum")
        if (isinstance(low, int | float) and found < low) or (isinstance(high, int | float) and found > high):
            continue
        out[key] = int(found) if kind == "integer" else found
    return out


def _options(schema: Mapping[str, Any], prop: Any) -> list[str]:
    if isinstance(prop, Mapping) and "$ref" in prop:
        name = str(prop["$ref"]).rsplit("/", 1)[-1]
        prop = schema.get("$defs", {}).get(name, prop)
    options = prop.get("enum", []) if isinstance(prop, Mapping) else []
    return [o for o in options if isinstance(o, str)]
