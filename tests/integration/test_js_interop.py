"""Our node against a JavaScript libp2p 2.9 peer configured as aikyo configures it, over loopback,
in both dial directions: metadata, subscriptions and payloads on all four topics both ways, and
gossipsub message ids that agree; and a conversation of over a minute with two ``companion run``
companions in which nobody is disconnected (the peer mounts no ping protocol, as aikyo).

The JavaScript dependencies are installed by ``support.js.js_peer_command`` (npm, into a cache
directory outside the repository). Skipped only where there is no Node.js and npm at all.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from companion.node.msgid import js_message_id
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    QUERIES,
    STATES,
    Action,
    Message,
    Metadata,
    Query,
    State,
    encode,
    encode_states,
)
from support.cards import metadata as md
from support.js import js_peer_command
from support.network import Event, Proc, helper_argv, network, publish_until_heard

pytestmark = pytest.mark.integration

PY = md("py", name="Py", personality="curious", story="a python node", sample="hi")
JS = md("js", name="Js", personality="steady", story="a javascript node", sample="yo")


@pytest.fixture(scope="module")
def js_peer() -> Iterator[list[str]]:
    """The command that starts the JavaScript peer, with its dependencies installed."""
    command = js_peer_command()
    if command is None:
        pytest.skip("Node.js and npm are not installed: the JavaScript interop peer cannot run")
    yield command


def start_js(js_peer: list[str], procs: list[Proc]) -> tuple[Proc, dict[str, object]]:
    proc = Proc("js", [*js_peer, JS.model_dump_json()], events_on="stdout", stdin=True)
    procs.append(proc)
    return proc, proc.event("started", 60)


def start_py(procs: list[Proc], *peers: str) -> tuple[Proc, dict[str, object]]:
    argv = [*helper_argv("node_driver"), PY.model_dump_json()]
    for peer in peers:
        argv += ["--peer", peer]
    proc = Proc("py", argv, events_on="stdout", stdin=True)
    procs.append(proc)
    return proc, proc.event("started", 30)


def payloads(sender: Metadata, to: Metadata, tag: str, states: list[State], gesture: str) -> dict[str, bytes]:
    """One payload of each topic from ``sender`` (``py`` or ``js``), told apart by ``tag``."""
    side = sender.id.removeprefix("companion_")
    return {
        MESSAGES: encode(Message.create(sender.id, [to.id], f"hello from {side} {tag}", id=f"{side}-{tag}")),
        STATES: encode_states(states),
        QUERIES: encode(Query.create(sender.id, "speak", {"text": tag}, id=f"{side}q-{tag}")),
        ACTIONS: encode(Action.create(sender.id, gesture, {"tag": tag})),
    }


def py_payloads(tag: str) -> dict[str, bytes]:
    states = [State.create(PY.id, "listen", 1, False), State.create(JS.id, "speak", 7, True)]
    return payloads(PY, JS, tag, states, "wave")


def js_payloads(tag: str) -> dict[str, bytes]:
    states = [State.create(JS.id, "speak", 3, True), State.create(PY.id, "listen", 2, False)]
    return payloads(JS, PY, tag, states, "nod")


def publishing(
    sender: Proc, payloads: Callable[[str], dict[str, bytes]], topic: str, heard_as: str
) -> Callable[[int], Callable[[Event], bool]]:
    """What :func:`publish_until_heard` calls: ``sender`` publishes its payload of ``topic``
    (a fresh one each attempt), and the other side logs it as a ``heard_as`` event."""

    def send(attempt: int) -> Callable[[Event], bool]:
        text = payloads(f"{topic}{attempt}")[topic].decode()
        sender.send({"op": "publish", "topic": topic, "text": text})
        return lambda e: e.get("event") == heard_as and e.get("topic") == topic and e.get("text") == text

    return send


def exchange(py: Proc, js: Proc, py_id: str) -> None:
    for topic in (MESSAGES, STATES, QUERIES, ACTIONS):
        # the first publishes may precede the other side's subscriptions
        got = publish_until_heard(
            publishing(py, py_payloads, topic, "message"), js, tries=40, wait=0.5, what=f"our {topic}"
        )
        assert got["from"] == py_id
        # js-libp2p's id for our message is the one our node computes
        rpc = rpc_pb2.Message(
            from_id=ID.from_base58(py_id).to_bytes(), seqno=int(str(got["seqno"])).to_bytes(8, "big")
        )
        assert got["msgId"] == base64.b64encode(js_message_id(rpc)).decode().rstrip("=")

        publish_until_heard(
            publishing(js, js_payloads, topic, "inbound"), py, tries=40, wait=0.5, what=f"js's {topic}"
        )


def check_session(py: Proc, js: Proc, py_id: str, js_id: str) -> None:
    # metadata both ways: aikyo's requester keeps the first chunk only, and answers empty when it knows us
    meta = js.event("metadata", 30, peer=py_id)
    assert meta["metadata"] == PY.model_dump()
    joined = py.event("joined", 30, companion_id=JS.id)
    assert joined["peer"] == js_id and joined["metadata"] == JS.model_dump()
    # subscriptions both ways: js sees ours; ours to js are proven by js -> py delivery below
    js.wait_for(
        lambda e: (
            e.get("event") == "subscriptions"
            and e.get("peer") == py_id
            and {MESSAGES, STATES, QUERIES, ACTIONS} <= set(e.get("topics", []))
        ),
        30,
        "our subscriptions",
    )
    exchange(py, js, py_id)
    assert js.count("metadata_error") == 0 and js.count("error") == 0 and py.count("error") == 0


def test_js_peer_dials_our_node(js_peer: list[str]) -> None:
    procs: list[Proc] = []
    try:
        py, py_started = start_py(procs)
        js, js_started = start_js(js_peer, procs)
        js.send({"op": "dial", "addr": py_started["addrs"][0]})  # type: ignore[index]
        js.event("dialled", 30)
        check_session(py, js, str(py_started["peer_id"]), str(js_started["peer_id"]))
    finally:
        for proc in procs:
            proc.stop()


def test_our_node_dials_js_peer(js_peer: list[str]) -> None:
    procs: list[Proc] = []
    try:
        js, js_started = start_js(js_peer, procs)
        addr = next(a for a in js_started["addrs"] if "/ip4/127.0.0.1/" in a)  # type: ignore[attr-defined]
        py, py_started = start_py(procs, addr)
        check_session(py, js, str(py_started["peer_id"]), str(js_started["peer_id"]))
    finally:
        for proc in procs:
            proc.stop()


@pytest.mark.early
def test_a_conversation_with_aikyo_services_stays_connected_for_a_minute(
    js_peer: list[str], tmp_path: Path
) -> None:
    """The JavaScript peer mounts exactly aikyo 1.6's services (gossipsub, identify: no ping) and
    talks with two ``companion run`` companions for over a minute, including 40 s of silence (the
    health checks then probe it with a Yamux ping, which it answers as every Yamux does). Nobody
    is disconnected: a node that required ``/ipfs/ping/1.0.0`` cut aikyo off within seconds."""
    procs: list[Proc] = []
    with network(tmp_path) as net:
        a, a_started = net.companion("a")
        b, b_started = net.companion("b", a_started["addrs"][0])
        js, js_started = start_js(js_peer, procs)
        try:
            js_id = str(js_started["peer_id"])
            for started in (a_started, b_started):
                js.send({"op": "dial", "addr": started["addrs"][0]})
                js.event("dialled", 30, addr=started["addrs"][0])
            for proc in (a, b):
                proc.event("companion_joined", 30, companion_id=JS.id)
            began = time.monotonic()

            def prompt(n: int) -> None:
                asked = f"js-prompt-{n}"
                # aikyo's envelope, plus our extension that opens a fresh exchange every time
                text = encode(
                    Message.create(
                        JS.id,
                        ["companion_a", "companion_b"],
                        f"what now? ({n})",
                        {"turn": 0, "closing": "none"},
                        id=asked,
                    )
                ).decode()
                for _attempt in range(3):  # the first may precede the mesh
                    js.send({"op": "publish", "topic": MESSAGES, "text": text})
                    if replied(js, asked, 8):
                        return
                raise AssertionError(f"no companion answered {asked}")

            for n in range(4):  # talk for about 20 s
                prompt(n)
                time.sleep(5)
            time.sleep(40)  # silence: longer than the health-check interval (30 s)
            prompt(4)
            prompt(5)
            elapsed = time.monotonic() - began
            assert elapsed >= 60, elapsed
            assert js.count("disconnected") == 0
            for proc in (a, b):
                assert proc.count("peer_disconnected", peer=js_id) == 0
                assert proc.count("companion_left", companion_id=JS.id) == 0
                stats = proc.stats()
                assert stats["disconnects"] == {} and stats["health"]["probe_failures"] == 0
            assert js.count("error") == 0
        finally:
            for proc in procs:
                proc.stop()


def replied(js: Proc, asked: str, timeout: float) -> bool:
    try:
        js.wait_for(
            lambda e: e.get("event") == "message" and f'"in_reply_to":"{asked}"' in str(e.get("text")),
            timeout,
        )
    except AssertionError:
        return False
    return True
