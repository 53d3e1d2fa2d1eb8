"""``companion explain MESSAGE_ID``: why each local companion did (or did not) answer a message.

Every companion keeps its decisions per message in its store (:class:`.engines.DecisionRecorder`,
the ``decisions`` table of :mod:`companion.store.sqlite`): the leader and its rank, the states array,
the speaker and why, yields and their reasons, model failures, the reply. This module reads
them from every companion's store under the given data directories (read-only, beside nodes
that run), merges them by time, and says each decision once: a decision every node took alike
(all of them choose the same speaker, for the same reason) is one line naming the companions.
What a line shows is the event's own ``why`` where it has one, else its telling fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from companion.conversation.signals import one_line
from companion.store.sqlite import DB_FILENAME, Decision, read_decisions, read_message

__all__ = ["Merged", "TurnSummary", "companion_stores", "explain", "explain_lines", "summarize_turns"]

MAX_SHOWN: Final = 160
"""Characters of one decision's text on a line (the rest is in ``--json``)."""
_QUIET_FIELDS: Final = frozenset({"message_id", "why", "states", "adjustments", "order", "companion"})
_OUTCOMES: Final = ("replied", "turn_unanswered", "speaker_failed", "speaker_yielded", "conversation_over")


@dataclass
class Merged:
    """One decision as the companions under the data directories took it (the same kind and
    text from several companions is one)."""

    at: float
    kind: str
    level: str
    text: str
    companions: list[str]
    fields: dict[str, Any]
    message_id: str


def companion_stores(data_dirs: Iterable[Path]) -> dict[str, Path]:
    """Companion id -> its store file, for every companion under ``data_dirs`` (a directory
    ``companion_*`` holding the store file; the first data directory wins a duplicate)."""
    found: dict[str, Path] = {}
    for data_dir in data_dirs:
        if not data_dir.is_dir():
            continue
        for path in sorted(data_dir.glob(f"companion_*/{DB_FILENAME}")):
            found.setdefault(path.parent.name, path)
    return found


def text_of(decision: Decision) -> str:
    """What one line says of a decision: its ``why`` (with the error or detail a failure
    carries), the array a ``states_published`` holds, else ``key=value`` of its telling fields."""
    fields = decision.fields
    why = fields.get("why")
    if isinstance(why, str) and why:
        text = why
        cause = fields.get("detail") or fields.get("error")
        if isinstance(cause, str) and cause and cause not in why:
            text = f"{why}: {cause}"
    elif decision.kind == "states_published" and isinstance(fields.get("states"), list):
        text = f"{_states(fields['states'])} (source {fields.get('source')}, closing {fields.get('stage')})"
    else:
        text = " ".join(f"{key}={_short(value)}" for key, value in fields.items() if key not in _QUIET_FIELDS)
    return one_line(text, MAX_SHOWN)


def _states(states: list[Any]) -> str:
    """``pim speak 4.6 selected, ostra listen 2`` from a states array as logged."""
    parts = []
    for state in states:
        if isinstance(state, dict):
            who = str(state.get("from", "?")).removeprefix("companion_")
            importance = state.get("importance")
            shown = f"{importance:.3g}" if isinstance(importance, int | float) else "?"
            chosen = " selected" if state.get("selected") else ""
            parts.append(f"{who} {state.get('state')} {shown}{chosen}")
    return ", ".join(parts) or "no states"


def _short(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def merge(decisions: Iterable[tuple[str, Decision]]) -> list[Merged]:
    """``(companion, decision)`` pairs as merged lines, in time order: a decision of the same
    kind and text about the same message as one already shown adds its companion there."""
    out: list[Merged] = []
    index: dict[tuple[str, str, str], Merged] = {}
    for companion, decision in sorted(decisions, key=lambda pair: (pair[1].at, pair[0], pair[1].seq)):
        text = text_of(decision)
        key = (decision.message_id, decision.kind, text)
        known = index.get(key)
        if known is not None:
            if companion not in known.companions:
                known.companions.append(companion)
            continue
        merged = Merged(
            decision.at,
            decision.kind,
            decision.level,
            text,
            [companion],
            decision.fields,
            decision.message_id,
        )
        index[key] = merged
        out.append(merged)
    return out


def explain(message_id: str, data_dirs: Sequence[Path]) -> tuple[dict[str, Any] | None, list[Merged]]:
    """The message (as the first store that has it keeps it: ``None`` when none does) and every
    local companion's decisions about it, merged."""
    stores = companion_stores(data_dirs)
    message = None
    pairs: list[tuple[str, Decision]] = []
    for companion, path in stores.items():
        if message is None:
            found = read_message(path, message_id)
            if found is not None:
                message = found.model_dump(by_alias=True, mode="json")["params"]
        pairs.extend((companion, d) for d in read_decisions(path, message_id=message_id))
    return message, merge(pairs)


def clock(at: float) -> str:
    """``HH:MM:SS.mmm`` in local time."""
    return datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]


def explain_lines(message_id: str, message: dict[str, Any] | None, merged: Sequence[Merged]) -> list[str]:
    """What ``companion explain`` prints: the message, then a line per merged decision."""
    if message is None:
        head = f"message {message_id} (not in any local companion's history)"
    else:
        to = ",".join(str(t) for t in message.get("to", []))
        text = one_line(str(message.get("message", "")), 100)
        head = (
            f"message {message_id} from {message.get('from')} to {to}: {json.dumps(text, ensure_ascii=False)}"
        )
    lines = [head]
    width = max((len(",".join(m.companions)) for m in merged), default=0)
    kinds = max((len(m.kind) for m in merged), default=0)
    for m in merged:
        about = "" if m.message_id == message_id else f" (the turn on {m.message_id})"
        who = ",".join(m.companions).ljust(width)
        lines.append(f"{clock(m.at)}  {who}  {m.kind.ljust(kinds)}  {m.text}{about}")
    if not merged:
        lines.append(
            "no local companion kept a decision about it (not addressed here, or older than what is kept)"
        )
    return lines


@dataclass
class TurnSummary:
    """One message's turn as the local companions saw it (``companion status``)."""

    message_id: str
    at: float
    sender: str | None = None
    leader: str | None = None
    speaker: str | None = None
    outcome: str = "no reply seen"
    companions: list[str] = field(default_factory=list)


def summarize_turns(stores: dict[str, Path], limit: int) -> list[TurnSummary]:
    """The last ``limit`` turns the companions of ``stores`` took part in, newest last."""
    pairs = [(c, d) for c, path in stores.items() for d in read_decisions(path, limit=limit * 40)]
    turns: dict[str, TurnSummary] = {}
    for companion, d in sorted(pairs, key=lambda pair: (pair[1].at, pair[1].seq)):
        turn = turns.setdefault(d.message_id, TurnSummary(d.message_id, d.at))
        if companion not in turn.companions:
            turn.companions.append(companion)
        fields = d.fields
        if d.kind == "leader_chosen":
            turn.sender = _str(fields.get("sender")) or turn.sender
            turn.leader = _str(fields.get("leader")) or turn.leader
        elif d.kind == "speaker_chosen":
            turn.speaker = _str(fields.get("speaker")) or turn.speaker
        elif d.kind in _OUTCOMES and not turn.outcome.startswith("replied"):
            turn.outcome = _outcome(companion, d)
    ordered = sorted(turns.values(), key=lambda t: t.at)
    return [t for t in ordered if t.leader is not None or t.outcome != "no reply seen"][-limit:]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _outcome(companion: str, d: Decision) -> str:
    if d.kind == "replied":
        return f"replied by {companion} ({d.fields.get('reply_id')})"
    if d.kind == "turn_unanswered":
        return "unanswered"
    if d.kind == "conversation_over":
        return f"conversation over ({d.fields.get('reason')})"
    who = _str(d.fields.get("yielder")) or companion  # a peer's yield, or this one's failure
    return f"{who} gave its slot up ({d.fields.get('reason')})"
