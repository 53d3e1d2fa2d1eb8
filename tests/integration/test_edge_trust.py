"""Attacks on real `companion run` processes (scripted models) from raw libp2p peers on
127.0.0.1, each followed by addressed messages the attacked companions must still answer.

- a lone surrogate (``"\\ud800"``, valid JSON) in a message's text, id or ``from``;
- the hijack after a crash: a raw peer claims a killed companion's id over the metadata protocol
  (also after the node that pinned it restarted), then the real companion comes back;
- squatting an id before its companion's first meeting, against a trust file and ``--trust``;
- forged ``speak`` results and forged approvals racing a client of the bridge of ``--ws``;
- a states array from the true leader relayed through another companion after the leader hung
  up on the receiver, and one from a peer pinned to another companion.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from companion.app.lines import BRIDGE_LINE
from companion.conversation.rules import select_leader
from companion.lines.sentences import join_sentences
from companion.node.identity import load_or_create_key_pair
from companion.protocol import MESSAGES, STATES, Message, State, encode, encode_states
from support.cards import speaking_card, write_card
from support.live import start_run, stdout_line
from support.live_bridge import blocking, message_frame, next_frame, start_bridge
from support.network import Event, Network, Proc, first_among, helper_argv, network

pytestmark = pytest.mark.integration

LONE = "\ud800"


# --- helpers -----------------------------------------------------------------------------------------


def publish(raw: Proc, topic: str, data: bytes, **extra: Any) -> None:
    raw.send({"op": "publish", "topic": topic, "b64": base64.b64encode(data).decode(), **extra})


def user_message(to: list[str], text: str, message_id: str, sender: str = "user_tester") -> bytes:
    return encode(Message.create(sender, to, text, id=message_id))


def replied(proc: Proc, message_id: str, timeout: float) -> Event | None:
    try:
        return proc.event("replied", timeout, message_id=message_id)
    except AssertionError:
        return None


def ask_until_replied(
    raw: Proc, proc: Proc, to: list[str], tag: str, attempts: int = 12, sender: str = "user_tester"
) -> Event:
    """Publish an addressed message (a fresh id each time: the first ones may precede the mesh)
    until ``proc`` replies to one; its ``replied`` event."""
    for n in range(attempts):
        message_id = f"{tag}-{n}-{uuid.uuid4().hex[:6]}"
        publish(raw, MESSAGES, user_message(to, f"Hello, {tag}?", message_id, sender=sender))
        event = replied(proc, message_id, 3.0)
        if event is not None:
            return event
    raise AssertionError(f"{proc.name} answered none of {attempts} messages ({tag})")


def connect(raw: Proc, addr: str) -> None:
    raw.send({"op": "connect", "addr": addr})
    raw.event("connected", 15, addr=addr)


def peer_of(started: Event) -> str:
    return str(started["peer_id"])


def node_stats(proc: Proc, node: str, timeout: float = 10.0) -> Event:
    """The ``stats`` event of one node of a ``companion run`` process (SIGUSR1 logs one per node)."""
    before = proc.count("stats", node=node)
    proc.signal(signal.SIGUSR1)
    return proc.after("stats", before, timeout, node=node)


def stats_when(proc: Proc, node: str, settled: Callable[[Event], bool], timeout: float = 10.0) -> Event:
    """The node's ``stats`` once ``settled`` holds (asked again every 0.2 s until ``timeout``),
    else the last one: a node counts a payload when it arrives, a while after its sender logged
    sending it, and on a busy machine the last one may still be on its way."""
    deadline = time.monotonic() + timeout
    stats = node_stats(proc, node)
    while not settled(stats) and time.monotonic() < deadline:
        time.sleep(0.2)
        stats = node_stats(proc, node)
    return stats


# --- the poison message -----------------------------------------------------------------------------


def test_a_lone_surrogate_in_text_id_or_from_silences_nobody(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        b, _ = net.companion("b", a_started["addrs"][0])
        raw, _ = net.raw(None)
        connect(raw, a_started["addrs"][0])
        a.event("companion_joined", 20, companion_id="companion_b")
        b.event("companion_joined", 20, companion_id="companion_a")
        ask_until_replied(raw, a, ["companion_a"], "warm")  # the mesh carries raw -> a

        both = ["companion_a", "companion_b"]
        poisons = [
            user_message(both, f"poisoned {LONE} text", "poison-text"),
            user_message(both, "poisoned id", f"poison-{LONE}"),
            user_message(both, "poisoned from", "poison-from", sender=f"user_{LONE}"),
        ]
        for n, data in enumerate(poisons, 1):
            assert b"\\ud800" in data  # plain ASCII on the wire: valid UTF-8 and valid JSON
            arrived_at_a(raw, a, data, n)

        # both keep answering, another person too (whose message does not overwrite what the
        # poisoned one left in working memory): together, then each on its own
        after = f"after-{uuid.uuid4().hex[:6]}"
        publish(raw, MESSAGES, user_message(both, "Still there, both of you?", after, sender="user_next"))
        first_among(
            (a, b), lambda e: e.get("event") == "replied" and e.get("message_id") == after, 16, "reply"
        )
        ask_until_replied(raw, a, ["companion_a"], "a-after", attempts=3, sender="user_next")
        ask_until_replied(raw, b, ["companion_b"], "b-after", attempts=3, sender="user_next")

        a_stats = a.stats()
        assert a_stats["drops"].get("invalid_unicode") == len(poisons), a_stats["drops"]
        assert "invalid_unicode" not in b.stats()["drops"]  # a forwarded none of them
        for proc in (a, b):
            assert proc.count("handler_failed") == 0
            assert proc.count("inbound", id="poison-text") == 0
            assert proc.running


def arrived_at_a(raw: Proc, a: Proc, data: bytes, n: int) -> None:
    """Publish a poison until ``a`` counted ``n`` of them (its ``drops`` in ``stats``): gossip is
    best effort, and a copy published while raw's mesh is rebuilt reaches nobody. A fresh copy
    (new seqno) is sent at most three times; what is asserted is that each one that arrives is
    counted once and harms nobody."""
    for _ in range(3):
        publish(raw, MESSAGES, data)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if a.stats()["drops"].get("invalid_unicode", 0) >= n:
                return
            time.sleep(0.2)
    raise AssertionError(f"a never counted poison {n}: {a.stats()['drops']}")


# --- pinned identities ------------------------------------------------------------------------------


def test_the_hijack_after_a_crash_is_refused_and_the_real_companion_let_back_in(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        b, b_started = net.companion("b", a_started["addrs"][0])
        b_peer = peer_of(b_started)
        a.event("companion_joined", 20, companion_id="companion_b", peer=b_peer)

        b.signal(signal.SIGKILL)  # the crash
        a.event("companion_left", 10, companion_id="companion_b")
        thief, thief_started = net.raw("b")  # serves companion_b's id over the metadata protocol
        connect(thief, a_started["addrs"][0])
        refused = a.event("metadata_refused", 15, companion_id="companion_b", peer=peer_of(thief_started))
        assert (refused["reason"], refused["owner"]) == ("id_pinned", b_peer)
        assert a.count("companion_joined", companion_id="companion_b") == 1

        # the node that pinned it crashes too: the pin comes back from its data directory
        a.signal(signal.SIGKILL)
        a.popen.wait(10)
        a2, a2_started = net.companion("a")  # the same data directory, so the same key and pins
        a2_addr = a2_started["addrs"][0]
        thief2, thief2_started = net.raw("b")  # another key this time
        connect(thief2, a2_addr)
        refused = a2.event("metadata_refused", 15, companion_id="companion_b", peer=peer_of(thief2_started))
        assert (refused["reason"], refused["owner"]) == ("id_pinned", b_peer)
        ask_until_replied(thief2, a2, ["companion_a"], "a-during")  # a2 answers; the thief is no one
        publish(thief2, MESSAGES, user_message(["companion_a"], "I am b", "forged-b", sender="companion_b"))

        # the real companion restarts with its key: let in, and its replies accepted
        b2, b2_started = net.companion("b", a2_addr)
        assert peer_of(b2_started) == b_peer
        a2.event("companion_joined", 20, companion_id="companion_b", peer=b_peer)
        reply = ask_until_replied(thief2, b2, ["companion_b"], "b-back")
        a2.event("inbound", 10, id=reply["reply_id"], sender="companion_b", peer=b_peer)
        ask_until_replied(thief2, a2, ["companion_a"], "a-after", attempts=3)

        drops = a2.stats()["drops"]
        assert drops.get("spoofed_sender", 0) >= 1  # the thief's message as companion_b
        assert a2.count("inbound", id="forged-b") == 0
        assert a2.count("companion_joined", companion_id="companion_b", peer=peer_of(thief2_started)) == 0
        trust = json.loads((tmp_path / "data-a" / "trust.json").read_text())
        assert trust["companions"]["companion_b"]["peer"] == b_peer


def test_a_trust_file_and_the_trust_flag_stop_squatting_before_the_first_meeting(tmp_path: Path) -> None:
    # the friend's key exists (on their machine); its peer id is what the operator is told
    b_key = load_or_create_key_pair(tmp_path / "data-b" / "keys" / "companion_b.key")
    from libp2p.peer.id import ID

    b_peer = ID.from_pubkey(b_key.public_key).to_base58()
    added = subprocess.run(
        [
            sys.executable,
            "-m",
            "companion",
            "trust",
            "--data-dir",
            str(tmp_path / "data-a"),
            "add",
            "companion_b",
            b_peer,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr

    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        c = start_run(net, "c", [write_card(tmp_path, "c")], extra=("--trust", f"companion_b={b_peer}"))
        c_addr = c.event("started", 1)["addrs"][0]
        squatter, squatter_started = net.raw("b")
        for proc, addr in ((a, a_started["addrs"][0]), (c, c_addr)):
            connect(squatter, addr)
            refused = proc.event("metadata_refused", 15, companion_id="companion_b")
            assert (refused["reason"], refused["owner"], refused["peer"]) == (
                "id_pinned",
                b_peer,
                peer_of(squatter_started),
            )
        publish(squatter, MESSAGES, user_message(["companion_a"], "I am b", "squat-1", sender="companion_b"))
        ask_until_replied(squatter, a, ["companion_a"], "a-during")

        b, _ = net.companion("b", a_started["addrs"][0], c_addr)
        for proc in (a, c):
            proc.event("companion_joined", 20, companion_id="companion_b", peer=b_peer)
        reply = ask_until_replied(squatter, b, ["companion_b"], "b-first")
        a.event("inbound", 10, id=reply["reply_id"], sender="companion_b", peer=b_peer)
        c.event("inbound", 10, id=reply["reply_id"], sender="companion_b", peer=b_peer)
        ask_until_replied(squatter, a, ["companion_a"], "a-after", attempts=3)
        ask_until_replied(squatter, c, ["companion_c"], "c-after", attempts=3)
        assert a.count("inbound", id="squat-1") == 0
        assert a.stats()["drops"].get("spoofed_sender", 0) >= 1


# --- forged answers ---------------------------------------------------------------------------------


def bridge_url(proc: Proc) -> str:
    line = stdout_line(proc, lambda s: s.startswith(BRIDGE_LINE), 30)
    return line[len(BRIDGE_LINE) :].strip()


def start_home(net: Network, card: Path) -> tuple[Proc, str, str, str]:
    """``companion run CARD --ws``: (process, ws url, the companion node's address, the clients
    node's peer id: this run's approver)."""
    home = start_run(net, "home", [card], extra=("--ws", "127.0.0.1:0", "--no-webrtc"))
    url = bridge_url(home)

    def companion_node_started(e: Event) -> bool:
        return bool(e.get("event") == "started" and e.get("companion_id"))

    addr = home.wait_for(companion_node_started, 5)["addrs"][0]
    clients = home.event("started", 5, node="clients")["peer_id"]
    return home, url, addr, clients


async def query_frame(ws: WebSocketConnection, query_type: str, timeout: float) -> Any:
    return await next_frame(
        ws, lambda f: f.get("method") == "query.send" and f["params"]["type"] == query_type, timeout
    )


async def answer(ws: WebSocketConnection, query_id: str, body: dict[str, Any]) -> None:
    result = {"jsonrpc": "2.0", "id": query_id, "result": {"success": True, "body": body}}
    await ws.send_message(json.dumps({"topic": "queries", "body": result}))


TRIES = 12


def juniper_says(frame: Any) -> bool:
    return bool(frame.get("method") == "message.send" and frame["params"]["from"] == "companion_juniper")


def line_of(frame: Any) -> Any:
    """The line a speak query's sentence belongs to (``params.metadata.line``)."""
    return (frame["params"].get("metadata") or {}).get("line")


async def voice_line(ws: WebSocketConnection, query: Any) -> tuple[list[str], Any]:
    """Answer ``query`` and each later sentence of its line (a line is voiced a sentence a
    query); the sentences, and Juniper's message that follows them."""
    said = [query["params"]["body"]["message"]]
    await answer(ws, query["id"], {"spoken": True})
    while True:
        frame = await next_frame(
            ws,
            lambda f: juniper_says(f) or (f.get("method") == "query.send" and line_of(f) == line_of(query)),
            30,
        )
        if juniper_says(frame):
            return said, frame
        said.append(frame["params"]["body"]["message"])
        await answer(ws, frame["id"], {"spoken": True})


async def test_forged_speak_results_never_beat_the_bridge_client(tmp_path: Path) -> None:
    card = write_card(tmp_path, "juniper", speaking_card("juniper", "Juniper", "speak_with_voice"))
    with network(tmp_path) as net:
        home, url, addr, clients = await blocking(start_home, net, card)
        forger, _ = await blocking(net.raw, None)
        await blocking(connect, forger, addr)
        forger.send({"op": "forge", "type": "speak", "answer": {"error": "forged: it was spoken"}})
        await blocking(forger.event, "forging", 10)
        async with open_websocket_url(url) as ws:
            for n in range(TRIES):
                await ws.send_message(
                    message_frame("user_tester", ["companion_juniper"], f"Tell me something, {n}.", f"m{n}")
                )
                query = await query_frame(ws, "speak", 30)
                with trio.move_on_after(0.5):  # the client plays the line; the companion must wait
                    early = await next_frame(ws, juniper_says, 1)
                    raise AssertionError(f"try {n}: the reply went out before its line was spoken: {early}")
                said, reply = await voice_line(ws, query)
                assert reply["params"]["message"] == join_sentences(said)
                event = await blocking(home.event, "query_answered", 10, query_id=query["id"])
                assert (event["peer"], event["type"], event["ok"]) == (clients, "speak", True)
        forged = forger.count("forged")
        assert forged >= TRIES - 2, f"the forger raced only {forged} of {TRIES} queries"
        juniper = await blocking(
            stats_when,
            home,
            "companion_juniper",
            lambda s: s["drops"].get("unauthorized_answer", 0) >= forged,
        )
        assert juniper["drops"].get("unauthorized_answer") == forged, juniper["drops"]
        assert home.count("voice_failed") == 0


async def test_a_separate_bridge_answers_once_the_operator_trusts_it(tmp_path: Path) -> None:
    """``companion run`` + ``companion bridge``: the bridge is just another peer to the companion
    until the operator says otherwise; ``companion trust add answerer`` counts at once."""
    card = write_card(tmp_path, "juniper", speaking_card("juniper", "Juniper", "speak_with_voice"))
    with network(tmp_path) as net:
        juniper = await blocking(start_run, net, "juniper", [card])
        addr = juniper.event("started", 1)["addrs"][0]
        bridge, port, b_started = await blocking(start_bridge, net, "bridge", addr)
        await blocking(bridge.event, "companion_joined", 30, companion_id="companion_juniper")
        bridge_peer = b_started["peer_id"]
        async with open_websocket_url(f"ws://127.0.0.1:{port}/") as ws:
            await ws.send_message(message_frame("user_tester", ["companion_juniper"], "Say it aloud!", "m-1"))
            query = await query_frame(ws, "speak", 30)
            first = line_of(query)
            await answer(ws, query["id"], {"spoken": True})
            dropped = await blocking(juniper.event, "payload_dropped", 15, peer=bridge_peer)
            assert dropped["reason"] == "unauthorized_answer"
            data_dir = str(tmp_path / "data-juniper")
            trusted = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "companion",
                    "trust",
                    "--data-dir",
                    data_dir,
                    "add",
                    "answerer",
                    bridge_peer,
                ],
                capture_stdout=True,
                capture_stderr=True,
            )
            assert trusted.returncode == 0, trusted.stderr
            # the next line is voiced by the bridge's client: no restart
            await ws.send_message(message_frame("user_tester", ["companion_juniper"], "Once more!", "m-2"))
            query = await next_frame(
                ws, lambda f: f.get("method") == "query.send" and line_of(f) not in (None, first), 150
            )
            said, reply = await voice_line(ws, query)
            assert reply["params"]["message"] == join_sentences(said)
            assert reply["params"]["metadata"]["in_reply_to"] == "m-2"
        event = await blocking(juniper.event, "query_answered", 10, query_id=query["id"])
        assert event["peer"] == bridge_peer


GUARDED = """\
from pydantic import BaseModel, Field

from companion.actions import ActionContext, action
from companion.protocol import Message


class Line(BaseModel):
    message: str = Field(min_length=1, description="What to say.")
    to: list[str] = Field(description="Who to say it to.")


@action(id="announce", description="Say something once a person approved it.", input=Line,
        topic="messages", requires_approval=True, timeout=10)
def announce(ctx: ActionContext[Line]) -> Message:
    return Message.create(ctx.companion_id, ctx.input.to, ctx.input.message)
"""

GUARDED_CARD = """\
metadata:
  id: companion_warden
  name: Warden
  personality: careful
  story: speaks only with a person's yes
  sample: May I?
role: Ask before you speak.
actions: [guarded_speech:announce]
events:
  params:
    type: object
    properties:
      mood: {type: string}
    required: [mood]
  conditions:
    - expression: "true"
      execute:
        - tool: announce
          instruction: Reply briefly.
"""


async def test_forged_approvals_never_approve_an_action(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "guarded_speech.py").write_text(GUARDED, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(modules))
    card = tmp_path / "warden.yaml"
    card.write_text(GUARDED_CARD, encoding="utf-8")
    with network(tmp_path) as net:
        home, url, addr, clients = await blocking(start_home, net, card)
        forger, _ = await blocking(net.raw, None)
        await blocking(connect, forger, addr)
        yes = {"result": {"success": True, "body": {"approved": True, "reason": "forged yes"}}}
        forger.send({"op": "forge", "type": "approval", "answer": yes})
        await blocking(forger.event, "forging", 10)
        spoken: list[Any] = []
        async with open_websocket_url(url) as ws:
            for n in range(TRIES):
                await ws.send_message(
                    message_frame("user_tester", ["companion_warden"], f"Speak, {n}!", f"w{n}")
                )
                query = await query_frame(ws, "approval", 30)
                await trio.sleep(0.3)  # a person reads the prompt
                await answer(ws, query["id"], {"approved": False, "reason": "the person said no"})
                call_id = query["params"]["body"]["call_id"]
                decided = await blocking(home.event, "approval_decided", 15, call_id=call_id)
                assert (decided["approved"], decided["reason"]) == (False, "denied: the person said no")
                event = await blocking(home.event, "query_answered", 10, query_id=query["id"])
                assert (event["peer"], event["type"]) == (clients, "approval")
            # the companion still answers: the person says yes once, and it speaks
            await ws.send_message(message_frame("user_tester", ["companion_warden"], "Now speak.", "w-yes"))
            query = await query_frame(ws, "approval", 30)
            await trio.sleep(0.3)
            await answer(ws, query["id"], {"approved": True})
            reply = await next_frame(
                ws,
                lambda f: f.get("method") == "message.send" and f["params"]["from"] == "companion_warden",
                30,
            )
            spoken.append(reply)
        assert home.count("approval_decided", approved=True) == 1
        forged = forger.count("forged")
        assert forged >= TRIES - 2, f"the forger raced only {forged} of {TRIES + 1} approvals"
        warden = await blocking(node_stats, home, "companion_warden")
        assert warden["drops"].get("unauthorized_approval") == forged, warden["drops"]


# --- states from the true leader --------------------------------------------------------------------


def start_driver(net: Network, key: str) -> tuple[Proc, Event]:
    metadata = {"id": f"companion_{key}", "name": key, "personality": "p", "story": "s", "sample": "x"}
    proc = Proc(
        key,
        [*helper_argv("node_driver"), json.dumps(metadata)],
        events_on="stdout",
        stdin=True,
    )
    net.procs.append(proc)
    return proc, proc.event("started", 30)


def led_by(leader: str, to: list[str], tag: str) -> Message:
    """A user message whose aikyo leader (md5 rule) is ``leader``."""
    for n in range(200):
        message = Message.create("user_tester", to, f"Who goes first? {tag}", id=f"{tag}-{n}")
        if select_leader(message, to) == leader:
            return message
    raise AssertionError("no id found")


def test_states_relayed_from_the_true_leader_are_accepted(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        x, x_started = net.companion("x")
        r, r_started = net.companion("r", x_started["addrs"][0])
        leader, leader_started = start_driver(net, "l")
        leader_peer = peer_of(leader_started)
        for addr in (x_started["addrs"][0], r_started["addrs"][0]):
            leader.send({"op": "connect", "addr": addr})
            leader.event("connected", 15, addr=addr)
        for proc in (x, r):
            proc.event("companion_joined", 20, companion_id="companion_l", peer=leader_peer)
        # the leader hangs up on x: from now on its payloads reach x only through r
        leader.send({"op": "disconnect", "peer": peer_of(x_started)})
        leader.event("disconnected", 15)
        x.event("peer_disconnected", 15, peer=leader_peer)  # still present: its announcements come through r
        user, _ = net.raw(None)
        connect(user, x_started["addrs"][0])
        ask_until_replied(user, x, ["companion_x"], "warm")

        to = ["companion_l", "companion_x"]
        for n in range(3):
            message = led_by("companion_l", to, f"relayed{n}")

            def relayed(e: Event, m: Message = message) -> bool:
                return e.get("event") == "inbound" and m.params.id in e.get("text", "")

            publish(user, MESSAGES, encode(message))
            leader.wait_for(relayed, 15)
            states = [
                State.create("companion_l", "listen", 1, False),
                State.create("companion_x", "speak", 9, True),
            ]
            leader.send({"op": "publish", "topic": STATES, "text": encode_states(states).decode()})
            chosen = x.event("speaker_chosen", 15, message_id=message.params.id)
            # the array counted as the leader's: its signer is the peer pinned to companion_l
            assert (chosen["speaker"], chosen["source"]) == ("companion_x", "companion_l")
            assert replied(x, message.params.id, 15) is not None

        # an array signed by a peer pinned to another companion is refused
        other, other_started = net.raw("z")
        connect(other, x_started["addrs"][0])
        x.event("companion_joined", 20, companion_id="companion_z")
        forged = [
            State.create("companion_l", "listen", 1, False),
            State.create("companion_x", "speak", 9, True),
        ]
        for _ in range(5):  # the first ones may precede the mesh
            publish(other, STATES, encode_states(forged))
            other.send({"op": "pace", "seconds": 0.3})
        dropped = x.event("payload_dropped", 15, peer=peer_of(other_started), topic=STATES)
        assert dropped["reason"] == "spoofed_sender"
        ask_until_replied(user, x, ["companion_x"], "x-after", attempts=3)
        assert x.count("speaker_chosen", source=peer_of(other_started)) == 0
