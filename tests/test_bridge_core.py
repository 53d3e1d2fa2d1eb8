"""The Firehose core: which client gets which frame, without sockets."""

from __future__ import annotations

import json

from companion.bridge.clients import QueueLimits
from companion.bridge.core import FirehoseCore
from companion.bridge.frames import FrameError
from companion.protocol import MESSAGES, QUERIES, STATES, Message, Query, State, encode, encode_states
from companion.transport import Inbound


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


def test_own_echo_is_ignored() -> None:
    core = FirehoseCore(self_peer="me")
    client, _ = core.connect()
    message = Message.create("user_a", ["companion_aya"], "hi")
    assert core.network_payload(inbound(MESSAGES, message, sender="me")).queued == ()
    assert core.network_payload(inbound(MESSAGES, message, sender="other")).queued == (client,)


def test_local_publish_reaches_other_clients_only() -> None:
    core = FirehoseCore()
    a, _ = core.connect()
    b, _ = core.connect()
    message = Message.create("user_a", ["companion_aya"], "hi")
    fanout = core.local_publish(MESSAGES, message, origin=a)
    assert fanout.queued == (b,)
    assert drain(core, b) == [encode(message).decode()]
    assert core.local_publish(MESSAGES, message, origin=None).queued == (a, b)


def test_slow_client_is_reported_and_others_unaffected() -> None:
    core = FirehoseCore(QueueLimits(max_frames=3))
    fast, _ = core.connect()
    slow, _ = core.connect()
    message = Message.create("companion_aya", ["user_a"], "hi")
    dropped = []
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
