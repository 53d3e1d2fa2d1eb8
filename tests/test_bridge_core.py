"""The Firehose core: which client gets which frame, without sockets."""

from __future__ import annotations

import json

from companion.bridge.clients import QueueLimits
from companion.bridge.core import MAX_AWAITED_ECHOES, FirehoseCore
from companion.bridge.frames import FrameError
from companion.memory import Inbound
from companion.protocol import MESSAGES, QUERIES, STATES, Message, Query, State, encode, encode_states


def inbound(
    topic: str, payload: Message | Query | list[State], sender: str = "peer-a", raw: bool = True
) -> Inbound:
    data = encode_states(payload) if isinstance(payload, list) else encode(payload)
    return Inbound(topic, payload, sender, data if raw else b"")


def drain(core: FirehoseCore, client: str) -> list[str]:
    queue = core._registry.queue(client)
    out = []
    while (frame := queue.pop()) is not None:
        out.append(frame)
    return out


def test_raw_payload_is_forwarded_unchanged() -> None:
    core = FirehoseCore()
    client, _ = core.connect()
    message = Message.create("companion_aya", ["user_a"], "やあ", {"emotion": "happy"})
    raw = (
        b'{"jsonrpc":"2.0","method":"message.send",'
        b'"params":{"id":"1","from":"companion_aya","to":[],"message":"x", "extra": 1}}'
    )
    item = Inbound(MESSAGES, message, "peer-a", raw)
    fanout = core.network_payload(item)
    assert fanout.queued == (client,)
    assert drain(core, client) == [raw.decode()]


def test_payload_without_raw_is_encoded() -> None:
    core = FirehoseCore()
    client, _ = core.connect()
    query = Query.create("companion_aya", "speak", {"message": "hi", "emotion": "happy"})
    core.network_payload(inbound(QUERIES, query, raw=False))
    assert json.loads(drain(core, client)[0])["params"]["type"] == "speak"


def test_states_only_on_request() -> None:
    core = FirehoseCore()
    plain, _ = core.connect()
    watcher, _ = core.connect({"messages", "states"})
    states = [State.create("companion_aya", "speak", 7, True)]
    assert core.network_payload(inbound(STATES, states)).queued == (watcher,)
    assert drain(core, plain) == []
    assert json.loads(drain(core, watcher)[0])[0]["params"]["from"] == "companion_aya"


def test_the_echo_of_a_clients_frame_reaches_every_other_client_once() -> None:
    """The bridge's node delivers what the bridge published back to it (the echo rule): the
    clients get it from there, all but the one that sent it."""
    core = FirehoseCore()
    a, _ = core.connect()
    b, _ = core.connect()
    message = Message.create("user_a", ["companion_aya"], "hi")
    core.sending(a, MESSAGES, message)
    echo = inbound(MESSAGES, message, sender="me")
    assert core.network_payload(echo).queued == (b,)
    assert drain(core, b) == [encode(message).decode()]
    assert core.network_payload(echo).queued == (a, b)  # the same bytes again: not an echo


def test_a_frame_sent_twice_is_kept_from_its_sender_twice_and_a_failed_one_not_at_all() -> None:
    core = FirehoseCore()
    a, _ = core.connect()
    b, _ = core.connect()
    message = Message.create("user_a", ["companion_aya"], "hi")
    core.sending(a, MESSAGES, message)
    core.sending(a, MESSAGES, message)
    echo = inbound(MESSAGES, message, sender="me")
    assert core.network_payload(echo).queued == (b,)
    assert core.network_payload(echo).queued == (b,)
    failed = core.sending(b, MESSAGES, message)
    core.not_sent(failed)
    assert core.network_payload(echo).queued == (a, b)


def test_what_the_bridge_itself_published_reaches_every_client() -> None:
    """The voice's speak results (sent by no client) come back to all of them."""
    core = FirehoseCore()
    a, _ = core.connect()
    b, _ = core.connect()
    message = Message.create("user_a", ["companion_aya"], "hi")
    assert core.network_payload(inbound(MESSAGES, message, sender="me")).queued == (a, b)


def test_awaited_echoes_are_bounded() -> None:
    core = FirehoseCore()
    a, _ = core.connect()
    first = Message.create("user_a", ["companion_aya"], "first")
    core.sending(a, MESSAGES, first)
    for i in range(MAX_AWAITED_ECHOES):
        core.sending(a, MESSAGES, Message.create("user_a", ["companion_aya"], f"m{i}"))
    assert len(core._awaited) == MAX_AWAITED_ECHOES
    assert core.network_payload(inbound(MESSAGES, first)).queued == (a,)  # forgotten: delivered


def test_slow_client_is_reported_and_others_unaffected() -> None:
    core = FirehoseCore(QueueLimits(max_frames=3))
    fast, _ = core.connect()
    slow, _ = core.connect()
    message = Message.create("companion_aya", ["user_a"], "hi")
    dropped: list[tuple[str, str]] = []
    for _ in range(10):
        fanout = core.network_payload(inbound(MESSAGES, message))
        drain(core, fast)
        dropped.extend(fanout.too_slow)
    assert len(dropped) == 1
    client, reason = dropped[0]
    assert client == slow and "3 frames waiting" in reason


def test_error_frames_are_queued_in_order() -> None:
    core = FirehoseCore()
    client, _ = core.connect()
    message = Message.create("companion_aya", ["user_a"], "hi")
    core.network_payload(inbound(MESSAGES, message))
    core.error_to(client, FrameError("not_json", "frame is not JSON"))
    frames = drain(core, client)
    assert json.loads(frames[0])["method"] == "message.send"
    assert json.loads(frames[1])["error"]["code"] == "not_json"
    assert core.error_to("gone", FrameError("not_json", "x")).queued == ()


def test_disconnect_forgets_client() -> None:
    core = FirehoseCore()
    client, _ = core.connect()
    core.disconnect(client)
    assert core.clients == []
    message = Message.create("companion_aya", ["user_a"], "hi")
    assert core.network_payload(inbound(MESSAGES, message)).queued == ()
