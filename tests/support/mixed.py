"""A mixed network on 127.0.0.1, for the mixed-network test and ``scripts/bench_mixed.py``: two
JavaScript peers of ``tests/js`` behaving as aikyo 1.6 companions (js-libp2p 2.9, aikyo's turn
behaviour: only an array's top speaker replies, yields ignored, ``closing: none`` arrays, no turn
limit), two ``companion run`` companions with different turn limits, and a client (a bare
py-libp2p peer that is no companion) that opens each conversation, addressed to all four.

What happens is read from one JavaScript peer's view of the wire (every payload on ``messages``
and ``states``, its own included), conversation by conversation:

- a conversation ends at a ``terminal`` array (aikyo's next-speaker rule chooses nobody) after
  which nobody speaks for ``quiet`` seconds; it *stalls* when its last message is unanswered
  (no reply, no ``terminal``) for ``stall`` seconds;
- each states array belongs to a message: a tagged one (ours) to the message of its tag, an
  untagged one (aikyo's) to the latest message before it that addresses a companion; its
  publisher is named (the signing peer), so what our nodes do is counted apart from what the
  aikyo peers do;
- a second array for a message is, when one of our nodes published it, a *closing* one when it
  is ``terminal`` and the first could not be followed (its speaker gave its slot up, the
  remaining slots aikyo's), else *ours_extra*; when an aikyo peer published it,
  *aikyo_after_our_terminal* when the first was our ``terminal`` (aikyo's leader publishes for
  every message it leads, whatever came before), else *aikyo_extra*;
- a reply past the highest turn limit is ours when one of our companions said it or one of our
  arrays chose its aikyo speaker, and aikyo's when an aikyo leader's array chose it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from companion.conversation.rules import ends_conversation, speaking_order, states_tag, turn_tag
from companion.protocol import COMPANION_ID_PREFIX, MESSAGES, Message, State, encode
from support.cards import CARD
from support.cards import metadata as md
from support.network import Network, Proc, network

__all__ = [
    "CAPS",
    "CLIENT",
    "SECOND_ARRAYS",
    "ConversationReport",
    "MixedNetwork",
    "mixed_network",
    "stories",
    "summary",
]

CLIENT = "user_client"
CAPS: dict[str, int] = {"p": 3, "q": 4}
"""Our two companions (``companion_p``, ``companion_q``) and their ``max_turns``."""
SECOND_ARRAYS = ("closing", "ours_extra", "aikyo_after_our_terminal", "aikyo_extra")
"""The kinds of a message's second states array (the module's docstring)."""
AIKYO = (
    md("j", name="Jun", personality="steady", story="an aikyo companion", sample="yo"),
    md("k", name="Kei", personality="bright", story="an aikyo companion", sample="hey"),
)


@dataclass
class ConversationReport:
    """One conversation as the wire showed it."""

    opener: str
    messages: list[str] = field(default_factory=list)
    """Ids of every message, the opener first, in arrival order."""
    senders: dict[str, str] = field(default_factory=dict)
    addressed: set[str] = field(default_factory=set)
    """Messages that address at least one companion."""
    arrays: dict[str, list[list[State]]] = field(default_factory=dict)
    """Message id -> the states arrays that belong to it, in arrival order."""
    publishers: dict[str, list[str]] = field(default_factory=dict)
    """Message id -> the companion whose node signed each of its arrays."""
    terminal_after: float | None = None
    """Seconds from the opener to the ``terminal`` array that ended it."""
    stalled: bool = False
    story: list[str] = field(default_factory=list)
    """What the wire showed, a line per message and array, with who published it."""

    @property
    def replies(self) -> int:
        return sum(1 for mid in self.messages[1:] if self.senders[mid].startswith(COMPANION_ID_PREFIX))

    def replies_past(self, limit: int) -> list[str]:
        """The replies after the first ``limit`` companion replies, by id."""
        replies = [mid for mid in self.messages[1:] if self.senders[mid].startswith(COMPANION_ID_PREFIX)]
        return replies[limit:]

    def second_arrays(self) -> Counter[str]:
        """The arrays past the first of a message, by kind (see the module's docstring)."""
        kinds: Counter[str] = Counter()
        for mid, arrays in self.arrays.items():
            first, publishers = arrays[0], self.publishers[mid]
            for later, publisher in zip(arrays[1:], publishers[1:], strict=True):
                if _is_ours(publisher):
                    closing = ends_conversation(later) and not ends_conversation(first)
                    kinds["closing" if closing else "ours_extra"] += 1
                else:
                    after_ours = ends_conversation(first) and _is_ours(publishers[0])
                    kinds["aikyo_after_our_terminal" if after_ours else "aikyo_extra"] += 1
        return kinds

    def past_cap(self, limit: int) -> list[tuple[str, str, bool]]:
        """Each reply past the first ``limit``: its id, whose it is (``ours``: one of our
        companions said it, or one of our arrays chose its aikyo speaker; ``aikyo``: an aikyo
        leader's array chose it; ``unexplained``), and whether our ``terminal`` array was the
        first to answer it."""
        out = []
        for mid in self.replies_past(limit):
            speaker = self.senders[mid]
            before = self.messages[self.messages.index(mid) - 1]
            chose = [
                publisher
                for states, publisher in zip(
                    self.arrays.get(before, []), self.publishers.get(before, []), strict=True
                )
                if speaking_order(states).first.speaker == speaker
            ]
            if _is_ours(speaker) or any(_is_ours(p) for p in chose):
                whose = "ours"
            else:
                whose = "aikyo" if chose else "unexplained"
            arrays = self.arrays.get(mid, [])
            answered = bool(arrays) and _our_terminal(arrays[0]) and _is_ours(self.publishers[mid][0])
            out.append((mid, whose, answered))
        return out


class MixedNetwork:
    """The five processes, started and meshed; :meth:`converse` runs one conversation."""

    def __init__(
        self, net: Network, js_command: list[str], *, delay_ms: int, pythonpath: str | None = None
    ) -> None:
        """``pythonpath``: run our companions from another checkout (a reference run)."""
        self.net = net
        self.js: list[Proc] = []
        ours: list[tuple[Proc, dict[str, Any]]] = []
        for key, cap in CAPS.items():
            path = net.tmp / f"{key}.yaml"
            path.write_text(
                CARD.format(key=key, settings=f"settings:\n  max_turns: {cap}\n"), encoding="utf-8"
            )
            peers = [ours[0][1]["addrs"][0]] if ours else []
            argv = [sys.executable, "-m", "companion.cli.run", str(path), "--no-mdns", "--listen"]
            argv += ["/ip4/127.0.0.1/tcp/0", "--data-dir", str(net.tmp / f"data-{key}"), "--log-format"]
            argv += ["json", "-v", *[a for peer in peers for a in ("--peer", peer)]]
            proc = Proc(key, argv, pythonpath=pythonpath)
            net.procs.append(proc)
            ours.append((proc, proc.event("started", timeout=30)))
        self.ours = [proc for proc, _ in ours]
        self.names: dict[str, str] = {
            str(started["peer_id"]): str(started["companion_id"]) for _, started in ours
        }
        """Peer id -> the companion whose node it is."""
        addrs = [str(started["addrs"][0]) for _, started in ours]
        for metadata in AIKYO:
            proc = Proc(
                metadata.id,
                [*js_command, metadata.model_dump_json(), "--answer-known"],
                events_on="stdout",
                stdin=True,
            )
            net.procs.append(proc)
            started = proc.event("started", 60)
            self.names[str(started["peer_id"])] = metadata.id
            for addr in addrs:
                proc.send({"op": "dial", "addr": addr})
                proc.event("dialled", 30, addr=addr)
            addrs.append(next(a for a in started["addrs"] if "/ip4/127.0.0.1/" in a))
            proc.send({"op": "aikyo", "delay_ms": delay_ms})
            proc.event("aikyo_on", 10)
            self.js.append(proc)
        self.client, _ = net.raw(None)
        for addr in addrs:
            self.client.send({"op": "connect", "addr": addr})
            self.client.event("connected", 30, addr=addr)
        everyone = [f"companion_{key}" for key in CAPS] + [m.id for m in AIKYO]
        for proc in self.ours:
            for cid in everyone:
                if cid != proc.name and f"companion_{proc.name}" != cid:
                    proc.event("companion_joined", 30, companion_id=cid)
        for proc, metadata in zip(self.js, AIKYO, strict=True):
            for cid in everyone:
                if cid != metadata.id:  # aikyo's directory: the companions it read metadata from
                    proc.wait_for(_metadata_of(cid), 30, f"{metadata.id} knows {cid}")
        self.observer = self.js[0]
        self._seen = len(self.observer.events)
        self.everyone = everyone
        self.count = 0

    def _events(self, timeout: float) -> list[dict[str, Any]]:
        """The observer's events past the last ones read, waiting up to ``timeout`` for one."""
        try:
            self.observer.wait_for(lambda e: len(self.observer.events) > self._seen, timeout)
        except AssertionError:
            return []
        fresh = self.observer.events[self._seen :]
        self._seen += len(fresh)
        return fresh

    def converse(self, *, quiet: float, stall: float, limit: float) -> ConversationReport:
        """Open one conversation and follow it until it ended (``quiet`` seconds of silence after
        a ``terminal`` array), stalled (``stall`` s with its last message unanswered), or
        ``limit`` seconds passed (reported as a stall)."""
        self.count += 1
        opener = Message.create(CLIENT, list(self.everyone), f"what shall we do? ({self.count})")
        report = ConversationReport(opener.params.id)
        began = time.monotonic()
        self.client.send({"op": "publish", "topic": MESSAGES, "text": encode(opener).decode()})
        by_tag: dict[int, str] = {}
        last_addressed: str | None = None
        last_change = began
        ended_at: float | None = None
        while True:
            now = time.monotonic()
            if ended_at is not None and now - last_change >= quiet:
                return report
            if (ended_at is None and now - last_change >= stall) or now - began >= limit:
                report.stalled = True
                return report
            wait = (quiet if ended_at is not None else stall) - (now - last_change)
            for event in self._events(max(0.05, min(wait, limit - (now - began)))):
                if event.get("event") != "message":
                    continue
                text = str(event.get("text"))
                if event.get("topic") == MESSAGES:
                    body = _json(text)
                    params = body.get("params") if isinstance(body, dict) else None
                    if not isinstance(params, dict) or body.get("method") != "message.send":
                        continue
                    mid = str(params.get("id"))
                    if mid != report.opener and not report.messages:
                        continue  # the tail of the conversation before
                    if mid in report.senders:
                        continue
                    report.messages.append(mid)
                    report.senders[mid] = str(params.get("from"))
                    message = Message.model_validate(body)
                    by_tag[turn_tag(message)] = mid
                    report.story.append(_told_message(message, report.replies))
                    if any(str(t).startswith(COMPANION_ID_PREFIX) for t in params.get("to", [])):
                        report.addressed.add(mid)
                        last_addressed = mid
                    last_change, ended_at = time.monotonic(), None
                elif event.get("topic") == "states" and report.messages:
                    states = [State.model_validate(s) for s in _json(text)]
                    tag = states_tag(states)
                    mid_or_none = by_tag.get(tag) if tag is not None else last_addressed
                    if mid_or_none is None:
                        continue
                    publisher = self.names.get(str(event.get("from")), str(event.get("from")))
                    report.arrays.setdefault(mid_or_none, []).append(states)
                    report.publishers.setdefault(mid_or_none, []).append(publisher)
                    report.story.append(_told_array(states, mid_or_none, publisher))
                    ends = ends_conversation(states) and mid_or_none == report.messages[-1]
                    if ends and ended_at is None:
                        ended_at = time.monotonic()
                        report.terminal_after = ended_at - began
                        last_change = ended_at


def _metadata_of(cid: str) -> Callable[[dict[str, Any]], bool]:
    """Whether an event of a JavaScript peer says it read ``cid``'s metadata."""
    return lambda e: e.get("event") == "metadata" and e["metadata"]["id"] == cid


def _our_terminal(states: list[State]) -> bool:
    """A ``terminal`` array of one of our leaders (tagged for its message)."""
    return ends_conversation(states) and states_tag(states) is not None


def _is_ours(companion_id: str) -> bool:
    return companion_id in {f"companion_{key}" for key in CAPS}


def _whose(companion_id: str) -> str:
    if _is_ours(companion_id):
        return "ours"
    return "aikyo" if companion_id.startswith(COMPANION_ID_PREFIX) else "person"


def _told_message(message: Message, replies: int) -> str:
    p = message.params
    meta = p.metadata or {}
    stamp = f" turn {meta['turn']} {meta.get('closing')}" if "turn" in meta else " unstamped"
    return f"{p.id[:8]} reply {replies} by {p.from_} ({_whose(p.from_)}) to {', '.join(p.to)};{stamp}"


def _told_array(states: list[State], mid: str, publisher: str) -> str:
    order = speaking_order(states)
    tagged = "tagged" if states_tag(states) is not None else "untagged"
    picks = order.first.speaker or "nobody"
    return (
        f"  array for {mid[:8]} by {publisher} ({_whose(publisher)}, {tagged}): "
        f"{order.first.closing}, top speaker {picks}"
    )


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


@contextmanager
def mixed_network(
    tmp: Path,
    js_command: list[str],
    *,
    delay_ms: int = 200,
    pythonpath: str | None = None,
    keep: Path | None = None,
) -> Iterator[MixedNetwork]:
    """The mixed network, every process stopped at the end (their tails shown on a failure).
    ``keep``: a directory that gets each process's whole output (``NAME.log``) at the end, to
    read what each node published and why."""
    with network(tmp) as net:
        try:
            yield MixedNetwork(net, js_command, delay_ms=delay_ms, pythonpath=pythonpath)
        finally:
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for proc in net.procs:
                    (keep / f"{proc.name}.log").write_text("\n".join(proc.lines) + "\n", encoding="utf-8")


def summary(reports: list[ConversationReport]) -> dict[str, Any]:
    """The figures of a run: stalls, arrays per addressed message, replies per conversation,
    conversations past the highest turn limit, time to ``terminal``."""
    per_message: Counter[int] = Counter()
    second: Counter[str] = Counter()
    for report in reports:
        for mid in report.addressed:
            per_message[len(report.arrays.get(mid, []))] += 1
        second.update(report.second_arrays())
    replies = [r.replies for r in reports]
    times = [r.terminal_after for r in reports if r.terminal_after is not None]
    highest = max(CAPS.values())
    ours_past_cap = sum(  # our companions' own replies beyond their own limits
        1
        for r in reports
        for key, cap in CAPS.items()
        for mid in r.replies_past(cap)
        if r.senders[mid] == f"companion_{key}"
    )
    past = [item for r in reports for item in r.past_cap(highest)]
    return {
        "conversations": len(reports),
        "stalls": sum(1 for r in reports if r.stalled),
        "arrays_per_addressed_message": dict(sorted(per_message.items())),
        "second_arrays": {kind: second[kind] for kind in SECOND_ARRAYS},
        "replies": replies,
        "replies_median": statistics.median(replies) if replies else None,
        "highest_cap": highest,
        "past_highest_cap": sum(1 for n in replies if n > highest),
        "replies_past_highest_cap": {
            whose: sum(1 for _, w, _ in past if w == whose) for whose in ("ours", "aikyo", "unexplained")
        },
        "of_them_answered_by_our_terminal": sum(1 for *_, answered in past if answered),
        "our_replies_past_own_cap": ours_past_cap,
        "terminal_s_median": round(statistics.median(times), 2) if times else None,
        "terminal_s_max": round(max(times), 2) if times else None,
    }


def stories(reports: list[ConversationReport], *, slow: float = 4.0) -> list[str]:
    """What the wire showed in each conversation that stalled, had a message with a second
    array, ran past the highest turn limit, or took more than ``slow`` seconds to ``terminal``
    (a leader or a speaker was awaited in vain): who published what, line by line."""
    highest = max(CAPS.values())
    out = []
    for n, report in enumerate(reports, 1):
        second = report.second_arrays()
        took = report.terminal_after
        late = took is not None and took > slow
        if report.stalled or second or report.replies > highest or late:
            kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(second.items()))
            out.append(
                f"conversation {n}: {report.replies} replies"
                + (", STALLED" if report.stalled else "")
                + (f", terminal after {took:.1f} s" if late and took is not None else "")
                + (f"; second arrays: {kinds}" if kinds else "")
            )
            out.extend(f"  {line}" for line in report.story)
    return out
