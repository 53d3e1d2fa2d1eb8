"""Background chatter never silences a conversation: three `companion run` processes (scripted
models) on 127.0.0.1, a bare libp2p peer publishing 25 unaddressed `message.send` per second for
30 s, and a person (a node in the test) addressing one or two companions meanwhile, every 1.5 s
or as soon as the previous question was answered (a second question to the same companion
before the first was answered would rightly withdraw the first reply). Every addressed message
gets exactly one reply, and no message is answered twice.

This is the condition issue 10 found: with the first engine any newer message, even ``to: []``
from a stranger, withdrew the reply being prepared, so the chatter left 3-4 of 6 addressed
messages unanswered."""

from __future__ import annotations

import base64
import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from companion.app.demo import DemoOptions, _Child, _run_child, _stop_children, _wait_child
from companion.conversation.transcript import Transcript
from companion.memory import Inbound
from companion.node import CompanionNode, NodeConfig
from companion.protocol import MESSAGES, Message, encode
from support.cards import write_card
from support.live_bridge import blocking
from support.network import Network, Proc, network

pytestmark = pytest.mark.integration

KEYS = ("a", "b", "c")
"""Three companions: a group, and questions to one or two of them. (Five until the suite had to
fit in 6 minutes again: every node, the test's own included, decodes every chatter message and
its gossip duplicates, so the test cost 50 CPU seconds with five, the suite's costliest.)"""
IDS = tuple(f"companion_{k}" for k in KEYS)
USER = "user_test"
CHATTER_RATE = 25
"""One unaddressed message every 40 ms reaches each companion inside every step of each reply.
At 50 the test cost 64 CPU seconds of a suite that must fit in 6 minutes on 2 cores (py-libp2p
spends about 6 ms of CPU a message on each receiver, docs/figures.md); the floods at 150 a
second are test_network_hostile.py's."""
CHATTER_SECONDS = 30
ASK_EVERY = 1.5
PACE = 0.5
"""Seconds a speaker pauses before its reply, as a model takes time: the chatter lands while each
question waits (a scripted reply at once left one or two chatter messages inside most waits)."""
ANSWER_WITHIN = 20.0
"""Seconds a question may wait for its reply: a lost states array costs a takeover (4 s offline),
a silent speaker a reply deadline (12 s)."""
PUBLISH_SLACK = 60.0
"""Seconds the chatter may take beyond its 30 s to be published: the raw peer paces it, and on a
loaded machine it falls behind its rate."""


class Person:
    """The test node's handler: a bystander's transcript of the companions' conversation."""

    def __init__(self, node: CompanionNode) -> None:
        self.node = node
        self.transcript = Transcript()
        self.chatter = 0
        self.changed = trio.Event()

    async def handle(self, inbound: Inbound) -> None:
        payload = inbound.payload
        if isinstance(payload, Message) and payload.params.from_ == "user_chatter":
            self.chatter += 1
        peer = inbound.sender_peer
        publisher = self.node.membership.companion_of(peer) or peer
        self.transcript.feed(payload, IDS, publisher=publisher, now=trio.current_time())
        self.changed.set()
        self.changed = trio.Event()

    def replies_to(self, message_id: str) -> list[str]:
        return list(self.transcript.replies.get(message_id, []))

    async def until(self, predicate: Any, timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while not predicate():
                await self.changed.wait()
            return True
        return False


def log_of(child: _Child) -> list[dict[str, Any]]:
    """A companion process's JSON log (its standard error went to a file: at 50 payloads a second
    a pipe read line by line would load this process more than the companions)."""
    out = []
    for line in child.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def diagnose(children: list[_Child]) -> str:
    """What each node did, for a failure: its turn decisions and what its edge dropped."""
    kinds = {
        "leader_chosen",
        "speaker_chosen",
        "replied",
        "speech_withdrawn",
        "speaker_failed",
        "speaker_yielded",
        "takeover",
        "speaker_silent",
        "states_deferred",
        "store_failed",
        "handler_failed",
        "payload_dropped",
        "companion_left",
    }
    lines = []
    for child in children:
        counts = Counter(e.get("event") for e in log_of(child) if e.get("event") in kinds)
        lines.append(f"{child.companion_id}: {dict(counts)} sees {sorted(child.directory)}")
    return "\n".join(lines)


@asynccontextmanager
async def companions(tmp_path: Path, nursery: trio.Nursery, *peers: str) -> AsyncIterator[list[_Child]]:
    """The ``companion run`` processes (scripted models), each dialling the ones before."""
    options = DemoOptions(cards=[], model="scripted", pace=PACE)
    children: list[_Child] = []
    try:
        for index, key in enumerate(KEYS):
            card = write_card(tmp_path, key)
            dial = [*peers, *(c.addrs[0] for c in children)]
            child: _Child = await nursery.start(partial(_run_child, card, index, dial, options, tmp_path))
            children.append(child)
            await _wait_child(child, lambda c: bool(c.addrs), 60, "start listening")
        for child in children:
            await _wait_child(child, lambda c: set(IDS) <= c.directory, 60, "meet the others")
        yield children
    finally:
        with trio.CancelScope(shield=True):
            await _stop_children(children)


def start_chatter(net: Network, addr: str) -> Proc:
    """A bare peer (no companion id) that will publish the chatter once told to."""
    raw, _ = net.raw(None)
    raw.send({"op": "connect", "addr": addr})
    raw.event("connected", 20)
    raw.send({"op": "pace", "seconds": 1 / CHATTER_RATE})
    return raw


def chatter(raw: Proc) -> int:
    """Queue 30 s of chatter at its rate (the raw peer paces it); the last one is acknowledged.
    It returns only when all but a pipe's worth were taken (the raw peer reads its commands as
    it publishes them), i.e. near the chatter's end: run it beside the questions, not before."""
    count = CHATTER_RATE * CHATTER_SECONDS
    for n in range(count):
        to = [] if n % 5 else ["companion_nobody"]
        data = encode(Message.create("user_chatter", to, f"background noise {n}"))
        raw.send(
            {
                "op": "publish",
                "topic": MESSAGES,
                "b64": base64.b64encode(data).decode(),
                "ack": n == count - 1,
            }
        )
    return count


async def until_published(raw: Proc, count: int, published: trio.Event) -> None:
    """Sets ``published`` once the raw peer published the last of ``count`` chatter messages."""
    await blocking(
        raw.wait_for,
        lambda e: e.get("event") == "published" and e["count"] >= count,
        CHATTER_SECONDS + PUBLISH_SLACK,
        "the chatter published",
    )
    published.set()


@pytest.mark.solo
@pytest.mark.timeout(300)  # start-up, up to 90 s of chatter (PUBLISH_SLACK) and the stop, loaded
async def test_every_addressed_message_gets_one_reply_under_chatter(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        node = CompanionNode(None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), name="test"))
        person = Person(node)
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run, person)
            node_addr = f"{node.listen_addrs[0]}/p2p/{node.peer_id}"
            async with companions(tmp_path, nursery, node_addr) as children:
                assert await node.wait_for(lambda: set(IDS) <= set(node.directory), 60)
                raw = await blocking(start_chatter, net, children[2].addrs[0])
                # the mesh forms on a heartbeat: resend one probe (same id) until it is answered
                probe = Message.create(USER, [IDS[0]], "Are you there?")
                for _ in range(20):
                    await node.publish(MESSAGES, probe)
                    if await person.until(lambda: person.replies_to(probe.params.id), 3):
                        break
                assert person.replies_to(probe.params.id), "no companion answered the probe"

                queued = CHATTER_RATE * CHATTER_SECONDS
                nursery.start_soon(blocking, chatter, raw)
                published = trio.Event()
                nursery.start_soon(until_published, raw, queued, published)
                started = trio.current_time()
                first_chatter = person.chatter
                asked: list[Message] = []
                waited: list[float] = []
                during: list[int] = []  # chatter heard while each question waited for its reply
                targets = itertools.cycle([(0,), (1, 2), (2,), (0, 1), (1,), (2, 0)])
                # questions for as long as the chatter is on the wire (30 s at its rate; longer
                # when a loaded machine slows the raw peer down), not for a fixed 30 s
                while not published.is_set():
                    to = [IDS[i] for i in next(targets)]
                    message = Message.create(USER, to, f"Question {len(asked)} for {', '.join(to)}")
                    await node.publish(MESSAGES, message)
                    asked.append(message)
                    sent, heard = trio.current_time(), person.chatter
                    await person.until(lambda m=message: person.replies_to(m.params.id), ANSWER_WITHIN)
                    waited.append(round(trio.current_time() - sent, 2))
                    during.append(person.chatter - heard)
                    await trio.sleep_until(started + len(asked) * ASK_EVERY)
                chatter_in_loop = person.chatter - first_chatter
                await trio.sleep(5)  # time for a second reply, were there one
                running = [child.process.returncode is None for child in children]
                why = diagnose(children)
                reached = sorted(
                    sum(1 for e in log_of(c) if e.get("sender") == "user_chatter") for c in children
                )
            nursery.cancel_scope.cancel()

    assert all(running), why
    missing = [m.params.message for m in asked if not person.replies_to(m.params.id)]
    assert not missing, f"{len(missing)} of {len(asked)} unanswered: {missing}\n{why}"
    assert all(len(person.replies_to(m.params.id)) == 1 for m in asked), {
        m.params.message: person.replies_to(m.params.id) for m in asked
    }
    assert person.transcript.double_speech == {}
    # the condition held: the chatter reached the companions while they talked (gossip on an
    # overloaded machine loses messages; then this test proves nothing, and says so)
    assert reached[len(reached) // 2] >= queued / 2, f"companions got {reached} of {queued} chatter messages"
    assert len(asked) >= 10, f"replies took {waited} s\n{why}"
    # and it held while the questions were asked: the chatter was on the wire during them
    # (before, the chatter was queued first, which took 26 of its 30 s, so most questions came
    # after it had ended)
    assert chatter_in_loop >= queued / 2, (
        f"only {chatter_in_loop} of {queued} chatter messages came during the questions"
    )
    assert sum(1 for n in during if n > 0) >= len(asked) * 3 // 4, f"chatter heard per question: {during}"
