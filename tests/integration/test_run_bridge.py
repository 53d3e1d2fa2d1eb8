"""`companion run CARD... --ws 127.0.0.1:0`: the bridge inside a companion process.

One process runs Juniper (which answers through a speak query) and Pim with the bridge; a second
process runs Ostra. A Firehose client of that process talks to Juniper and follows the whole
conversation: every payload arrives once (the carrier's own through the bridge, its echo
ignored; the others' through gossip), Juniper's speak queries reach the client and its answers
reach Juniper's engine in the same process, and the conversation reaches `terminal`. With
WebRTC, the process's own voice answers the speak query and Juniper goes on.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from companion.app.lines import parse_sees
from companion.conversation.transcript import Transcript
from companion.lines.sentences import join_sentences
from companion.listen.client import directory_url, fetch_companions
from companion.protocol import Message, Query, QueryResult, encode
from companion.rtc import RtcClient, connect_rtc
from companion.voice import EspeakSynthesizer
from support.cards import speaking_card, write_card
from support.live import bridge_url, payload_of, start_run, stdout_line
from support.live_bridge import blocking, message_frame
from support.network import Proc, network

pytestmark = pytest.mark.integration

JUNIPER = "companion_juniper"
PIM = "companion_pim"
OSTRA = "companion_ostra"
EVERYONE = frozenset({JUNIPER, PIM, OSTRA})


def node_addr(proc: Proc, companion_id: str) -> str:
    return str(proc.event("started", 5, companion_id=companion_id)["addrs"][0])


def sees_everyone(proc: Proc, companion_id: str) -> None:
    stdout_line(proc, lambda s: parse_sees(s) == (companion_id, EVERYONE), 30)


async def test_a_client_of_companion_run_follows_a_conversation_to_terminal(tmp_path: Path) -> None:
    cards = [
        write_card(tmp_path, "juniper", speaking_card("juniper", "Juniper", "speak_with_voice")),
        write_card(tmp_path, "pim", speaking_card("pim", "Pim", "speak")),
    ]
    ostra_card = write_card(tmp_path, "ostra", speaking_card("ostra", "Ostra", "speak"))
    with network(tmp_path) as net:
        home = await blocking(start_run, net, "home", cards, extra=("--ws", "127.0.0.1:0", "--no-webrtc"))
        url = await blocking(bridge_url, home)
        peers = [await blocking(node_addr, home, JUNIPER), await blocking(node_addr, home, PIM)]
        away = await blocking(start_run, net, "away", [ostra_card], *peers, seed=5)
        for proc, cid in ((home, JUNIPER), (home, PIM), (away, OSTRA)):
            await blocking(sees_everyone, proc, cid)

        transcript = Transcript()
        seen: Counter[str] = Counter()  # message and query ids, results apart
        voiced: dict[str, tuple[str, str]] = {}  # Juniper's speak query id -> (its line, sentence)
        async with open_websocket_url(f"{url}?topics=messages,queries,actions,states") as ws:
            # the page lists every companion this process's companions see
            listed = await fetch_companions(directory_url(url, None))
            assert {m.id for m in listed} == EVERYONE
            # to all three (a reply addresses its conversation, not every companion present),
            # Juniper first
            opening = Message.create(
                "user_mika", sorted(EVERYONE), "Juniper, how is the sea?", metadata={"next_speaker": JUNIPER}
            )
            frame = json.dumps({"topic": "messages", "body": json.loads(encode(opening))})
            transcript.feed(opening, EVERYONE)  # (a client does not get its own frame back)
            first: str | None = await _send_until_answered(ws, frame)
            with trio.move_on_after(120):
                while not transcript.over:
                    # the bridge sends text frames only (as _send_until_answered reads them)
                    text = first or str(await ws.get_message())
                    first = None
                    payload = payload_of(text)
                    assert payload is not None, text
                    if isinstance(payload, Message):
                        seen[payload.params.id] += 1
                        if payload.params.from_ == JUNIPER:
                            lines: dict[str, list[str]] = {}
                            for line, sentence in voiced.values():
                                lines.setdefault(line, []).append(sentence)
                            assert payload.params.message in {join_sentences(v) for v in lines.values()}, (
                                "spoke before its line was voiced"
                            )
                    elif isinstance(payload, Query):
                        seen[payload.id] += 1
                        assert payload.params.from_ == JUNIPER and payload.params.type == "speak"
                        line = str((payload.params.metadata or {}).get("line"))
                        voiced[payload.id] = (line, str((payload.params.body or {})["message"]))
                        result = {
                            "jsonrpc": "2.0",
                            "id": payload.id,
                            "result": {"success": True, "body": {"spoken": True}},
                        }
                        await ws.send_message(json.dumps({"topic": "queries", "body": result}))
                    elif isinstance(payload, QueryResult):
                        seen[f"result:{payload.id}"] += 1
                    transcript.feed(payload, EVERYONE)

    assert transcript.over, "\n".join(f"{e.kind} {e.speaker} {e.closing} {e.why}" for e in transcript.events)
    opening_id = opening.params.id
    assert seen[opening_id] == 0, "the sender got its own frame back"
    assert {k: n for k, n in seen.items() if n > 1} == {}, "a payload reached the client twice"
    assert not any(k.startswith("result:") for k in seen), "the client got its own answers back"
    assert transcript.double_speech == {}
    replies = [e for e in transcript.events if e.kind == "message" and e.in_reply_to]
    assert replies[0].speaker == JUNIPER and replies[0].in_reply_to == opening_id
    assert len({r.speaker for r in replies}) >= 2, [r.speaker for r in replies]
    assert voiced, "Juniper never asked for its line to be voiced"
    assert transcript.events[-1].reason == "terminal"


async def _send_until_answered(ws: WebSocketConnection, frame: str) -> str:
    """Send ``frame`` (again, with the same id, until something comes back: the clients' node
    joins the gossip mesh on a heartbeat); returns the first frame received."""
    for _attempt in range(10):
        await ws.send_message(frame)
        with trio.move_on_after(3):
            return str(await ws.get_message())
    raise AssertionError("nothing came back to the client's message")


@pytest.mark.skipif(
    not EspeakSynthesizer.available(),
    reason="espeak-ng is not installed (scripts/system-deps.sh installs it)",
)
async def test_the_voice_of_companion_run_answers_its_own_companions_speak_query(tmp_path: Path) -> None:
    card = write_card(tmp_path, "juniper", speaking_card("juniper", "Juniper", "speak_with_voice"))
    with network(tmp_path) as net:
        home = await blocking(start_run, net, "home", [card], extra=("--ws", "127.0.0.1:0"))
        url = await blocking(bridge_url, home)
        base = url.replace("ws://", "http://").rstrip("/")
        async with connect_rtc(base, voice=True) as alice:
            await alice.send_text(message_frame("user_alice", [JUNIPER], "Good evening!", "m-1"))
            query = await _rtc_frame(alice, lambda f: f.get("method") == "query.send", 60)
            result = await _rtc_frame(alice, lambda f: f.get("id") == query["id"] and "result" in f, 60)
            assert result["result"]["success"] is True
            # the result published by this process's voice reached Juniper's engine here
            reply = await _rtc_frame(
                alice, lambda f: f.get("method") == "message.send" and f["params"]["from"] == JUNIPER, 60
            )
            assert reply["params"]["message"].startswith(query["params"]["body"]["message"])


async def _rtc_frame(client: RtcClient, predicate: Callable[[Any], bool], timeout: float) -> Any:
    with trio.fail_after(timeout):
        while True:
            frame = json.loads(await client.receive_text())
            if predicate(frame):
                return frame
