"""What a real model is told for each of the three calls: pure text builders, no I/O.

Each builder returns ``(instructions, prompt)``: the system-level instructions and the user
prompt. Inputs are bounded (recent history, clipped card fields) so a long conversation or a
verbose card cannot blow up the request.

Laid out for the server's prompt cache, stable first, volatile last: the instructions are the
same text on every call of one companion (its persona, role and rules, for the parameters and
the speech alike; for the leader the coordinator's rules and the companions), the conversation
comes next (which only grows at its end from turn to turn: the providers quote a window of it
whose start moves in steps, and the speaker's past turns as they were asked, :mod:`.window`) and
the task of this call last.
llama.cpp and llama-cpp-python reuse the longest evaluated prefix (the last
request's; with ``--cache true`` any recent one's), so a call evaluates little more than the new
lines and its task. The task comes last also because a small model continues whatever the prompt
ends with: a ``Context: {...}`` block placed last came back, measured, as SmolLM2-135M's reply.

The speaker sees the conversation as chat turns (:func:`speaker_turns`): its own lines as its
own (assistant) turns, the others' as ``id: line`` in the user's turns, the last of which
carries the task. Measured with SmolLM2-135M behind llama-cpp-python: shown as a numbered record
in one prompt ("1. user_bench -> Juniper (companion_juniper): ..."), it wrote the record on
("User_bench -> user_bench: What is your favourite sound at night?") in rounds of 5 out of 5,
and every line said was the card's own. The leader's states call keeps the record: it answers
numbers, not a line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TypeAlias

from companion.models.base import ParamsRequest, SpeakRequest, StatesRequest, ToolSpec
from companion.models.structured import speech_args, wire_tool_names
from companion.protocol import Message, Metadata
from companion.text import clip

__all__ = [
    "HISTORY_LIMIT",
    "Turns",
    "answer_rule",
    "format_history",
    "params_prompt",
    "persona",
    "speak_prompt",
    "speaker_instructions",
    "speaker_turns",
    "speaking_note",
    "states_prompt",
]

HISTORY_LIMIT = 12
"""How many recent messages a prompt quotes (the triggering message always included)."""

_FIELD_LIMIT = 600
_TEXT_LIMIT = 1000

Turns: TypeAlias = tuple[tuple[bool, str], ...]
"""Earlier chat turns, oldest first: ``(mine, text)``, ``mine`` for the speaker's own lines."""


def _who(companion_id: str, names: Mapping[str, str]) -> str:
    name = names.get(companion_id)
    return f"{name} ({companion_id})" if name else companion_id


def format_history(
    history: Sequence[Message], message: Message, names: Mapping[str, str], limit: int = HISTORY_LIMIT
) -> str:
    """Recent messages as numbered lines, oldest first, ending with the triggering ``message``."""
    lines = []
    for number, item in enumerate(_recent(history, message, limit), start=1):
        p = item.params
        to = ", ".join(_who(t, names) for t in p.to) or "everyone"
        lines.append(f"{number}. {_who(p.from_, names)} -> {to}: {clip(p.message, _TEXT_LIMIT)}")
    return "\n".join(lines)


def _recent(history: Sequence[Message], message: Message, limit: int) -> list[Message]:
    """The last ``limit`` messages a prompt quotes, oldest first, ``message`` last."""
    recent = [m for m in history if m.params.id != message.params.id][-(limit - 1) :] if limit > 1 else []
    return [*recent, message]


def answer_rule(tool_name: str, json_schema: Mapping[str, object] | None, *, as_json: bool = False) -> str:
    """How to hand in a structured answer: by calling the output tool, or (``as_json``, for
    servers that cannot force a tool call) as one JSON object written out, valid against
    ``json_schema`` (quoted here when given; otherwise the prompt shows it)."""
    if not as_json and json_schema is None:
        return f"Call the {tool_name} tool exactly once."
    rule = "Answer with one JSON object and nothing else (no prose, no code fence), valid against "
    if json_schema is None:
        return rule + "the JSON Schema below."
    return rule + f"this JSON Schema: {json.dumps(json_schema, ensure_ascii=False, sort_keys=True)}"


def persona(me: Metadata, role: str) -> str:
    """Who the companion is, from its card."""
    return (
        f"You are {me.name} (id {me.id}), a companion in a group conversation with other AI "
        "companions and people.\n"
        f"Personality: {clip(me.personality, _FIELD_LIMIT)}\n"
        f"Background: {clip(me.story, _FIELD_LIMIT)}\n"
        f"How you talk (sample): {clip(me.sample, _FIELD_LIMIT)}\n"
        f"Your role: {clip(role, _FIELD_LIMIT)}"
    )


def states_prompt(
    request: StatesRequest, tool_name: str, json_schema: Mapping[str, object] | None = None
) -> tuple[str, str]:
    """The leader's one call: every addressed companion's state for the next turn (through the
    ``tool_name`` tool, or as JSON valid against ``json_schema`` when that is given)."""
    names = {c.id: c.name for c in request.companions}
    instructions = (
        "You coordinate turn-taking in a group conversation between AI companions. Answer "
        "briefly, with what the next turn needs:\n"
        "- speak: one number per companion listed, in that order: 0 if it should listen now, "
        "else 1 to 10, higher when what it would say matters more now;\n"
        "- selected: only if the last message explicitly asks companions to answer: their ids;\n"
        "- closing: only when the conversation nears its end: 'pre-closing' when topics are "
        "running out, 'closing' when people say goodbye, 'terminal' when it is over."
    )
    companions = "\n".join(
        f"{n}. {c.id}: {c.name}; {clip(c.personality, 200)}" for n, c in enumerate(request.companions, 1)
    )
    rules = []
    if request.nominated:
        rules.append(f"The sender asked {_who(request.nominated, names)} to speak next: mark it selected.")
    if request.closing_floor != "none":
        rules.append(f"The closing stage is at least '{request.closing_floor}' (it never moves back).")
    # The companions come after the history, and the history names nobody: who is addressed
    # changes from turn to turn (the last speaker is not), and what changes must not cut the
    # cached prefix short. The answer's rule (its schema lists the companions) comes last.
    prompt = (
        f"Conversation so far:\n{format_history(request.history, request.message, {})}\n\n"
        f"Companions to decide for, in order:\n{companions}\n\n"
        + ("\n".join(rules) + "\n" if rules else "")
        + f"Decide the next turn ({request.turn}): one number per companion listed. "
        + answer_rule(tool_name, json_schema)
    )
    return instructions, prompt


_SPEAKER_RULES = (
    "Each turn you first assess the situation, then you speak. When you speak, say only your own "
    "words, as {name}: stay in character, keep it short and natural (one to three sentences), "
    "answer what was said, and never repeat a line that was already said, nor these notes."
)


def speaker_instructions(
    me: Metadata, role: str, note: str = "", assessed: Mapping[str, object] | None = None
) -> str:
    """The instructions of both of a speaker's calls, the same on every call of this companion:
    who it is, how it speaks and how its words reach the others (``note``, from
    :func:`speaking_note`), and the parameters it assesses before it speaks when a parameters
    call comes first (``assessed``, the card's schema), so a server's cache keeps them
    evaluated. In the parameters call's task the schema was evaluated anew every turn: that task
    was 75 of the about 120 prompt tokens the call evaluated (SmolLM2-135M's tokenizer), 26
    without it."""
    rules = _SPEAKER_RULES.format(name=me.name)
    text = f"{persona(me, role)}\n\n{rules}" + (f"\n{note}" if note else "")
    if assessed is None:
        return text
    schema = json.dumps(assessed, ensure_ascii=False, sort_keys=True)
    return (
        f"{text}\nBefore you speak, you are asked to assess the situation: then you fill in these "
        f"parameters from the conversation and your character, and say nothing.\n"
        f"Parameters (JSON Schema): {schema}"
    )


def speaking_note(wire_names: Mapping[str, ToolSpec], text_reply: bool) -> str:
    """How the speaker's words reach the others, in the form its server takes (``text_reply``:
    the answer's text is the line; else its action tools, by name). The same every turn, so it
    belongs to the instructions: in the task it was evaluated anew on every call (46 of about
    135 prompt tokens a turn with SmolLM2's tokenizer, measured)."""
    if text_reply:
        return (
            "Answer with only the words you say out loud, nothing else: no name or label in front, "
            "no quotation marks, no notes."
        )
    actions = [name for name, spec in wire_names.items() if spec.kind == "action"]
    knowledge = [name for name, spec in wire_names.items() if spec.kind == "knowledge"]
    lines = [
        "Others hear you through your action tools; an answer without a tool call is said "
        "out loud as it is, so then write only your words.",
        f"Action tools (they do something others see): {', '.join(actions) or 'none'}.",
    ]
    if knowledge:
        named = ", ".join(knowledge)
        lines.append(f"Knowledge tools (they tell you something; use only if needed): {named}.")
    return "\n".join(lines)


def speaker_turns(
    me: Metadata,
    history: Sequence[Message],
    message: Message,
    limit: int = HISTORY_LIMIT,
    asked: Mapping[str, str] | None = None,
) -> tuple[Turns, str]:
    """The recent conversation (``message`` last) as the speaker's chat turns: the earlier turns,
    and the others' lines since its own last one, which open the last user turn (the task
    follows them). Identical in the two calls of a turn; the next turn's begin with these. The
    earlier turns start with a user's turn (a chat must: an own line first is left out).

    ``asked`` maps the others' lines that opened an earlier turn to that turn's whole user turn
    as it was sent, its task included (:meth:`~.window.HistoryWindow.asked`): each own line then
    follows what it answered, word for word, and the prompt extends the earlier request and its
    answer, which a server's cache still holds."""
    turns, heard = _split(me, history, message, limit, asked or {})
    return turns, _heard_text(heard)


def _split(
    me: Metadata, history: Sequence[Message], message: Message, limit: int, asked: Mapping[str, str]
) -> tuple[Turns, list[Message]]:
    """:func:`speaker_turns`, with the others' lines since the speaker's own still as messages."""
    turns: list[tuple[bool, str]] = []
    heard: list[Message] = []
    for item in _recent(history, message, limit):
        if item.params.from_ != me.id:
            heard.append(item)
            continue
        if heard:
            text = _heard_text(heard)
            turns.append((False, asked.get(text, text)))
            heard = []
        if turns:
            turns.append((True, clip(item.params.message, _TEXT_LIMIT)))
    return tuple(turns), heard


def _heard_text(heard: Sequence[Message]) -> str:
    """Others' lines as the speaker's user turn quotes them: ``id: line``, one a line."""
    return "\n".join(f"{m.params.from_}: {clip(m.params.message, _TEXT_LIMIT)}" for m in heard)


def _heard(me: Metadata, history: Sequence[Message], message: Message) -> list[Message]:
    """The others' lines since the speaker's own last one (in the window): they open both of its
    last user turns, and its answer goes back to whoever said them."""
    return _split(me, history, message, HISTORY_LIMIT, {})[1]


def params_prompt(
    request: ParamsRequest, tool_name: str, as_json: bool = False, text_reply: bool = False
) -> tuple[str, str]:
    """The speaker's situation parameters, as its card's ``events.params`` schema describes them
    (through the ``tool_name`` tool, or written out as JSON when ``as_json``). The instructions
    are the speak call's (``text_reply``: the form that call takes), so the speak call that
    follows reuses the evaluated prefix on a server that keeps only the last request's."""
    note = speaking_note(wire_tool_names(request.tools), text_reply)
    instructions = speaker_instructions(request.me, request.role, note, request.schema)
    heard = _heard_text(_heard(request.me, request.history, request.message))
    if heard and not as_json:
        # A forced call needs no task: the instructions say what the parameters are and that
        # they are filled before the speaker speaks, and the server fills the tool's schema. The
        # task was evaluated anew every turn, after the new lines and before any word is heard
        # (8 of the 34 tokens SmolLM2-135M's parameters request evaluated a turn, measured).
        return instructions, heard
    task = "Assess the situation now."
    if as_json:
        # Nothing forces the form: the task says it. A forced tool call (the request names the
        # tool; a server fills its schema) needs none of it, and the instructions say what the
        # parameters are for: the task is evaluated anew every turn, before any word is heard
        # (19 of the 54 tokens SmolLM2-135M's parameters request evaluated a turn, measured).
        task = (
            "Assess the situation now: fill in the parameters from the conversation and your "
            "character. " + answer_rule(tool_name, request.schema)
        )
    return instructions, f"{heard}\n\n{task}" if heard else task


def speak_prompt(
    request: SpeakRequest, wire_names: Mapping[str, ToolSpec], text_reply: bool = False
) -> tuple[str, str]:
    """The speaker's turn: the conversation, then what is remembered, trigger instructions,
    closing stage, and last the turn line with the recipients when it tells something (they
    are not just whoever spoke since the speaker's own line: :func:`_heard`) and the question
    to answer (how its words reach the others is in the instructions: :func:`speaking_note`).

    ``text_reply`` is for servers that take no tools: the answer's text is the line said.

    A lone instruction for the words themselves is written alone, with no heading and no tool
    name (:func:`_says_the_line`): the task is evaluated anew every turn, after the new lines and
    before any word can be heard, and the heading and the name were 17 of a turn's 71 prompt
    tokens with SmolLM2-135M (about 6 ms each on a 2-core CPU, measured).
    """
    by_id = {spec.id: name for name, spec in wire_names.items()}
    lines = _remembered(request.extra.get("memory"))
    if len(request.instructions) == 1 and (text_reply or _says_the_line(request, wire_names)):
        lines.append(request.instructions[0].instruction)
    elif request.instructions and text_reply:
        lines.append("Follow these instructions in what you say:")
        lines.extend(f"- {i.instruction}" for i in request.instructions)
    elif request.instructions:
        lines.append("Follow these instructions, using every tool named:")
        lines.extend(f"- {by_id.get(i.tool, i.tool)}: {i.instruction}" for i in request.instructions)
    closing = {
        "pre-closing": "The conversation is winding down: start wrapping up your topic.",
        "closing": "The conversation is ending: say goodbye in your own way.",
        "terminal": "The conversation is over: at most a very short farewell.",
    }.get(request.closing)
    if closing:
        lines.append(closing)
    heard = _heard(request.me, request.history, request.message)
    last: list[str] = []
    if not lines or set(request.recipients) != {m.params.from_ for m in heard}:
        # Said only when it tells something: the answer goes back to whoever spoke since the
        # speaker's own line, and who the speaker is the instructions say. The line was 17 of the
        # 32 prompt tokens a one-to-one turn evaluated anew before any word (SmolLM2-135M).
        recipients = ", ".join(request.recipients) or "everyone"
        last.append(f"It is your turn ({request.me.name}). Address: {recipients}.")
    if text_reply:
        last.append(f"What do you say now, {request.me.name}? Only your words.")
    if last:
        lines += ["", *last]
    prompt = (f"{_heard_text(heard)}\n\n" if heard else "") + "\n".join(lines)
    note = speaking_note(wire_names, text_reply)
    return speaker_instructions(request.me, request.role, note, request.assessed), prompt


def _says_the_line(request: SpeakRequest, wire_names: Mapping[str, ToolSpec]) -> bool:
    """Whether the request's one instruction (the caller has checked there is one) is for the
    card's one action and that action says a line: the answer, a call or plain text, can then
    only go to it (plain text is said through it), so the instruction needs no tool's name."""
    actions = [spec for spec in wire_names.values() if spec.kind == "action"]
    return (
        len(actions) == 1
        and actions[0].id == request.instructions[0].tool
        and speech_args(actions[0], "-", request.recipients) is not None
    )


_MEMORY_ITEMS = 8
_BOOKKEEPING = frozenset({"conversation"})
"""Working memory the engine keeps for itself (turn counts, ids): nothing for the model to say."""


def _remembered(memory: object) -> list[str]:
    """The companion's working memory as plain lines (never JSON, which a small model reads
    aloud), at most :data:`_MEMORY_ITEMS` of them."""
    if not isinstance(memory, Mapping):
        return []
    items = [(str(k), v) for k, v in memory.items() if k not in _BOOKKEEPING][:_MEMORY_ITEMS]
    if not items:
        return []
    shown = [
        (key, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)) for key, v in items
    ]
    return ["What you remember:"] + [f"- {clip(key, 60)}: {clip(v, 200)}" for key, v in shown]
