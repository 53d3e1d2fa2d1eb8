"""The offline default model: scripted, deterministic lines in character, no network.

:class:`ScriptedModel` is not a language model. It builds each line from templates, the card
(name, personality, story, sample) and the last message, so a conversation runs end to end on
any machine, in tests and in the demo. Every choice comes from a random generator seeded with
``seed`` and the *content* of the request (never message ids or the clock), so the same seed
and the same conversation give the same lines on every run.

It behaves as the engine expects a model to: the leader's states favour whoever the last
message named, someone always wants to speak, and after a seeded number of replies it proposes
``pre-closing`` so the conversation winds down to ``terminal`` by itself. It follows the
trigger instructions in order (knowledge tools first, then a speaking tool), varies its lines
and avoids repeating its own recent ones.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from ..log import log_event
from ..protocol import ClosingStage, Message, Metadata
from ..turns import bigram_jaccard
from .base import (
    ModelError,
    ParamsRequest,
    SpeakRequest,
    StateDecision,
    StatesRequest,
    ToolCaller,
    ToolSpec,
)

__all__ = ["ScriptedModel"]

logger = logging.getLogger("companion.models.scripted")

Language = Literal["en", "ja"]

_SPEAKING_TOOLS: Final = ("speak", "speak_with_voice")
_INTRO_WORDS: Final = ("introduc", "自己紹介", "名乗")
_SPOKEN_WORDS: Final = ("repl", "spoke", "spoken", "talked", "introduc", "greet", "already", "met")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]")
_SENTENCE_END = re.compile(r"(?<=[.!?。!?])\s*")
_TRIM: Final = " \"'「」『』.,!?。、!?"
_QUOTED = re.compile(r'"[^"]*"|「[^」]*」|『[^』]*』')
_CLAUSE_END = re.compile(r"[、。,.!?!?;;]")

_REACTIONS: Final[dict[Language, tuple[str, ...]]] = {
    "en": (
        '{other}, you said "{echo}" and that stuck with me.',
        '"{echo}" - I like where this is going, {other}.',
        "Hmm, {echo}... let me think about that for a second.",
        'Oh, {other}! I keep thinking about "{echo}".',
        "I was hoping someone would bring that up, {other}.",
        "Wait, {other}: {echo}! I did not see that coming.",
        "That's a fair point, {other}.",
        "Ha, {other}, you always find the interesting angle.",
    ),
    "ja": (
        "{other}、「{echo}」って言葉、なんだか心に残ったよ。",
        "「{echo}」かあ。{other}、その話もっと聞きたいな。",
        "うーん、{echo}……ちょっと考えてみるね。",
        "{other}!「{echo}」のこと、ずっと考えてたんだ。",
        "{other}がその話をしてくれるの、待ってたんだ。",
        "えっ、{other}、{echo}って本当なんだ。",
        "{other}の言うこと、すごくよくわかるよ。",
        "{other}って、いつも面白いところに気づくよね。",
    ),
}

_FOLLOW_UPS: Final[dict[Language, tuple[str, ...]]] = {
    "en": (
        "Being {trait}, I'd love for us to try it together.",
        "Being {trait}, I can't help wondering what comes next.",
        "It reminds me of my own story: {story}.",
        "What would you do in my place, {third}?",
        "Tell me more, I'm all ears.",
        "Maybe we could look at it from a completely different side.",
        "{third}, what do you think?",
        "I feel like there's something new to discover here.",
        "Let's not rush it; the best ideas take a moment.",
        "Honestly, that's the kind of thing that makes my day.",
    ),
    "ja": (
        "{trait}私としては、みんなで一緒にやってみたいな。",
        "{trait}私だから、この先どうなるのか気になっちゃう。",
        "私の話をすると、{story}。",
        "{third}だったら、どうする?",
        "もっと聞かせて、ちゃんと聞いてるから。",
        "まったく違う角度から見てみるのもいいかもね。",
        "{third}はどう思う?",
        "ここには何か新しい発見がありそうな気がする。",
        "焦らなくていいよ、いいアイデアには少し時間がかかるもの。",
        "正直、こういう話が一番うれしいんだ。",
    ),
}

_CLOSING_LINES: Final[dict[Language, dict[ClosingStage, tuple[str, ...]]]] = {
    "en": {
        "pre-closing": (
            "It's getting a bit late, though.",
            "We've covered a lot today, haven't we?",
            "I think we're slowly coming to the end of this topic.",
        ),
        "closing": (
            "It was really nice talking with you all. See you next time!",
            "Thank you for the lovely chat, everyone. Bye for now!",
            "Let's pick this up again another day. Take care!",
        ),
    },
    "ja": {
        "pre-closing": (
            "そろそろいい時間になってきたね。",
            "今日はたくさん話せたね。",
            "この話題もそろそろ一段落かな。",
        ),
        "closing": (
            "みんなと話せて本当に楽しかった。またね!",
            "素敵なおしゃべりをありがとう。それじゃあ、また!",
            "続きはまた今度話そうね。元気でね!",
        ),
    },
}

_POSITIVE: Final = (
    "love",
    "great",
    "fun",
    "happy",
    "nice",
    "楽し",
    "嬉し",
    "うれし",
    "好き",
    "素敵",
    "!",
    "!",
)
_NEGATIVE: Final = ("sad", "sorry", "tired", "lonely", "寂し", "悲し", "疲れ", "残念")


def _language(*texts: str) -> Language:
    return "ja" if any(_CJK.search(t) for t in texts) else "en"


def _display_name(cid: str, names: Mapping[str, str], language: Language) -> str:
    if cid in names:
        return names[cid]
    if not cid.startswith("companion_"):
        return "きみ" if language == "ja" else "friend"  # a person at a client
    return cid.removeprefix("companion_") or cid


def _first_clause(text: str, limit: int) -> str:
    clause = _CLAUSE_END.split(text.strip(), maxsplit=1)[0].strip()
    return clause[:limit].rstrip()


def _words_up_to(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:")


def _trait(text: str, language: Language, limit: int | None = None) -> str:
    """The first clause (ja) or sentence (en) of a card field, to quote inside a line."""
    if language == "ja":
        return _first_clause(text, limit or 24)
    sentence = _SENTENCE_END.split(text.strip(), maxsplit=1)[0].rstrip(".!?")
    sentence = _words_up_to(sentence, limit or 60)
    return sentence[:1].lower() + sentence[1:]


def _echo(text: str, language: Language, names: Mapping[str, str]) -> str:
    """A short fragment of the last message to react to: from its last sentence, quotes left out
    (lines that quote lines that quote lines read badly)."""
    unquoted = _QUOTED.sub("", text).strip()
    sentences = [s.strip() for s in _SENTENCE_END.split(unquoted) if len(s.strip()) > 1] or [text]
    sentence = sentences[-1]
    fragment = _first_clause(sentence, 18) if language == "ja" else " ".join(sentence.split()[:7])
    fragment = fragment.strip(_TRIM)
    first = fragment.split(" ", 1)[0].strip(",")
    if language == "en" and first != "I" and first not in names.values() and fragment[1:2].islower():
        fragment = fragment[:1].lower() + fragment[1:]  # it goes mid-sentence
    return fragment or ("それ" if language == "ja" else "that")


def _asked(text: str, companion: Metadata) -> bool:
    """Whether a question in ``text`` names ``companion`` (that is how a line passes the turn)."""
    for sentence in _SENTENCE_END.split(text):
        folded = sentence.casefold()
        if sentence.rstrip().endswith(("?", "?")) and (
            companion.name.casefold() in folded or companion.id.casefold() in folded
        ):
            return True
    return False


class ScriptedModel:
    """A deterministic stand-in for a language model (offline, in character, for demos and tests).

    ``min_replies``..``max_replies`` bound the seeded conversation length after which the
    leader proposes ``pre-closing``.
    """

    def __init__(self, seed: int = 0, *, min_replies: int = 6, max_replies: int = 10) -> None:
        if not 1 <= min_replies <= max_replies:
            raise ValueError(f"need 1 <= min_replies <= max_replies, got {min_replies}, {max_replies}")
        self.seed = seed
        self._min_replies = min_replies
        self._max_replies = max_replies

    @property
    def name(self) -> str:
        return f"scripted(seed={self.seed})"

    def _rng(self, *parts: object) -> random.Random:
        # String seeds go through SHA-512: stable across processes and PYTHONHASHSEED.
        return random.Random("\x1f".join([str(self.seed), *map(str, parts)]))

    def conversation_length(self, first: Message | None) -> int:
        """How many replies this seed lets a conversation run before proposing to close."""
        key = "" if first is None else first.params.message
        return self._rng("length", key).randint(self._min_replies, self._max_replies)

    # --- states ------------------------------------------------------------------------------

    async def decide_states(self, request: StatesRequest) -> list[StateDecision]:
        message = request.message
        text = message.params.message
        length = self.conversation_length(request.history[0] if request.history else message)
        closing: ClosingStage = "pre-closing" if request.turn + 1 >= length else "none"
        named = [c.id for c in request.companions if _asked(text, c)]
        out: list[StateDecision] = []
        for companion in request.companions:
            rng = self._rng("state", companion.id, message.params.from_, text, request.turn)
            wants = rng.random() < 0.65
            importance = float(rng.randint(1, 9))
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
            pick = self._rng("keen", text, request.turn).randrange(len(out))
            d = out[pick]
            out[pick] = StateDecision(d.companion_id, "speak", max(d.importance, 5.0), d.selected, closing)
        return out

    # --- parameters --------------------------------------------------------------------------

    async def fill_params(self, request: ParamsRequest) -> dict[str, Any]:
        me = request.me.id
        spoken = any(m.params.from_ == me for m in request.history)
        rng = self._rng("params", me, request.message.params.message, len(request.history))
        value = self._fill(request.schema, "", rng, spoken, request.message)
        return value if isinstance(value, dict) else {}

    def _fill(self, schema: Any, key: str, rng: random.Random, spoken: bool, message: Message | None) -> Any:
        """A sensible value for ``schema``; ``key`` is the property name (it hints at meaning)."""
        if not isinstance(schema, Mapping):
            return None
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self._pick_enum(schema["enum"], key, rng, message)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        lowered = key.casefold()
        if kind == "object" or (kind is None and isinstance(schema.get("properties"), Mapping)):
            props = schema.get("properties", {})
            return {
                name: self._fill(sub, name, rng, spoken, message)
                for name, sub in props.items()
                if isinstance(name, str)
            }
        if kind == "boolean":
            if any(word in lowered for word in _SPOKEN_WORDS):
                return spoken
            return rng.random() < 0.5
        if kind in ("integer", "number"):
            low = schema.get("minimum", 0)
            high = schema.get("maximum", max(low, 10))
            if kind == "integer":
                return rng.randint(int(low), int(high))
            return round(rng.uniform(float(low), float(high)), 2)
        if kind == "string":
            if message is None:
                return ""
            if any(word in lowered for word in ("name", "speaker", "partner", "who", "from")):
                return message.params.from_
            return _echo(message.params.message, _language(message.params.message), {})
        if kind == "array":
            count = int(schema.get("minItems", 0))
            return [self._fill(schema.get("items", {}), key, rng, spoken, message) for _ in range(count)]
        return None

    def _pick_enum(
        self, options: Sequence[Any], key: str, rng: random.Random, message: Message | None
    ) -> Any:
        lowered = key.casefold()
        if message is not None and any(word in lowered for word in ("emotion", "mood", "feeling")):
            mood = self._mood(message.params.message)
            if mood in options:
                return mood
        return options[rng.randrange(len(options))]

    @staticmethod
    def _mood(text: str) -> str:
        folded = text.casefold()
        if any(word in folded for word in _NEGATIVE):
            return "sad"
        if any(word in folded for word in _POSITIVE):
            return "happy"
        return "neutral"

    # --- speaking ----------------------------------------------------------------------------

    async def speak(self, request: SpeakRequest, call_tool: ToolCaller) -> None:
        tools = {t.id: t for t in request.tools}
        knowledge: dict[str, Any] = {}
        for instruction in request.instructions:
            spec = tools.get(instruction.tool)
            if spec is not None and spec.kind == "knowledge" and spec.id not in knowledge:
                result = await call_tool(spec.id, self._inputs_for(spec))
                knowledge[spec.id] = result.get("output")
        tool = self._speaking_tool(request, tools)
        if tool is None:
            raise ModelError(
                f"{self.name}: no tool to speak with (tools: {', '.join(tools) or 'none'}); "
                "give the card a speaking action such as 'speak'"
            )
        text = self._compose(request, knowledge)
        arguments = self._speak_input(tool, request, text)
        result = await call_tool(tool.id, arguments)
        status = result.get("status")
        if status == "invalid_input":
            arguments = self._speak_input(tool, request, text, minimal=True)
            result = await call_tool(tool.id, arguments)
            status = result.get("status")
        if status != "ok":
            log_event(
                logger,
                "scripted_speak_not_ok",
                logging.WARNING,
                companion=request.me.id,
                tool=tool.id,
                status=status,
                detail=result.get("message"),
            )

    def _speaking_tool(self, request: SpeakRequest, tools: Mapping[str, ToolSpec]) -> ToolSpec | None:
        def speaks(spec: ToolSpec | None) -> bool:
            props = spec.input_schema.get("properties", {}) if spec is not None else {}
            return spec is not None and spec.kind == "action" and "message" in props

        for instruction in request.instructions:
            if speaks(tools.get(instruction.tool)):
                return tools[instruction.tool]
        for name in _SPEAKING_TOOLS:
            if speaks(tools.get(name)):
                return tools[name]
        return next((spec for spec in tools.values() if speaks(spec)), None)

    def _inputs_for(self, spec: ToolSpec) -> dict[str, Any]:
        rng = self._rng("input", spec.id)
        schema = dict(spec.input_schema)
        schema.setdefault("type", "object")
        value = self._fill(schema, "", rng, False, None)
        return value if isinstance(value, dict) else {}

    def _speak_input(
        self, tool: ToolSpec, request: SpeakRequest, text: str, *, minimal: bool = False
    ) -> dict[str, Any]:
        props: Mapping[str, Any] = tool.input_schema.get("properties", {})
        arguments: dict[str, Any] = {"message": text}
        if "to" in props:
            arguments["to"] = list(request.recipients)
        if "emotion" in props:
            arguments["emotion"] = self._emotion(tool, request, minimal)
        return arguments

    def _emotion(self, tool: ToolSpec, request: SpeakRequest, minimal: bool) -> str:
        schema = tool.input_schema
        prop = schema.get("properties", {}).get("emotion", {})
        if "$ref" in prop:
            name = str(prop["$ref"]).rsplit("/", 1)[-1]
            prop = schema.get("$defs", {}).get(name, prop)
        options = [o for o in prop.get("enum", []) if isinstance(o, str)]
        wanted = (
            "happy"
            if request.closing in ("closing", "terminal")
            else self._mood(request.message.params.message)
        )
        if minimal or not options:
            return "neutral" if "neutral" in options or not options else options[0]
        return wanted if wanted in options else options[0]

    def _compose(self, request: SpeakRequest, knowledge: Mapping[str, Any]) -> str:
        me = request.me
        message = request.message
        language = _language(me.sample, me.personality, message.params.message)
        names = dict(request.extra.get("names", {}))
        for value in knowledge.values():
            if isinstance(value, Mapping):
                for cid, meta in value.items():
                    if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
                        names.setdefault(str(cid), meta["name"])
        if any(word in i.instruction.casefold() for i in request.instructions for word in _INTRO_WORDS):
            already = any(m.params.from_ == me.id for m in request.history)
            if not already and me.sample.strip():
                return me.sample.strip()
        other = _display_name(message.params.from_, names, language)
        thirds = [
            r
            for r in request.recipients
            if r not in (me.id, message.params.from_) and r.startswith("companion_")
        ]
        mine = [m.params.message for m in request.history if m.params.from_ == me.id][-3:]
        rng = self._rng("line", me.id, message.params.from_, message.params.message, len(request.history))
        combos = [(r, f) for r in _REACTIONS[language] for f in _FOLLOW_UPS[language]]
        rng.shuffle(combos)
        fields = {
            "other": other,
            "echo": _echo(message.params.message, language, names),
            "trait": _trait(me.personality, language),
            "story": _trait(me.story, language, limit=40 if language == "ja" else 90),
            "third": _display_name(thirds[rng.randrange(len(thirds))], names, language) if thirds else other,
        }
        closing_pool = _CLOSING_LINES[language].get(request.closing, ())
        tail = closing_pool[rng.randrange(len(closing_pool))] if closing_pool else ""
        separator = "" if language == "ja" else " "
        lines = []
        for reaction, follow in combos:
            parts = [reaction] if request.closing == "closing" else [reaction, follow]
            if tail:
                parts.append(tail)
            lines.append(separator.join(p.format(**fields) for p in parts))
        # Vary: the first line not too close to one of my own last three.
        return next(
            (line for line in lines if all(bigram_jaccard(line, old) < 0.6 for old in mine)), lines[0]
        )
