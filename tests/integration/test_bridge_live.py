"""A Firehose client (as aikyo's examples write one) with a live companion network: separate
processes on 127.0.0.1 running the conversation engine, joined by a `companion bridge`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from companion.lines.sentences import join_sentences
from support.live import start_live
from support.live_bridge import blocking, message_frame
from support.network import network

pytestmark = pytest.mark.integration

JUNIPER = "companion_juniper"
PIM = "companion_pim"


async def test_client_talks_with_live_companions_and_answers_speak_queries(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        live = await blocking(start_live, net)
        async with open_websocket_url(f"ws://127.0.0.1:{live.port}/") as ws:
            await ws.send_message(
                message_frame(
                    "user_tester", [JUNIPER, PIM], "Hello both! What did you see tonight?", str(uuid.uuid4())
                )
            )
            replies: list[dict[str, Any]] = []
            answered: dict[str, list[str]] = {}  # a line's id -> its sentences voiced, in order
            voiced_then_sent = False
            with trio.move_on_after(90):
                while not (voiced_then_sent and {r["params"]["from"] for r in replies} >= {JUNIPER, PIM}):
                    frame = json.loads(await ws.get_message())
                    if frame.get("method") == "query.send" and frame["params"]["type"] == "speak":
                        assert frame["params"]["from"] == JUNIPER
                        line = frame["params"]["body"]["message"]
                        # playback takes a moment; the companion must wait for it
                        await trio.sleep(0.3)
                        result = {
                            "jsonrpc": "2.0",
                            "id": frame["id"],
                            "result": {"success": True, "body": {"spoken": True}},
                        }
                        await ws.send_message(json.dumps({"topic": "queries", "body": result}))
                        answered.setdefault(str(frame["params"]["metadata"]["line"]), []).append(line)
                    elif frame.get("method") == "message.send" and frame["params"]["from"].startswith(
                        "companion_"
                    ):
                        replies.append(frame)
                        if frame["params"]["from"] == JUNIPER:
                            # Juniper's message comes only after its line was voiced, a sentence
                            # a query
                            assert frame["params"]["message"] in map(join_sentences, answered.values())
                            voiced_then_sent = True
            senders = {r["params"]["from"] for r in replies}
            assert senders >= {JUNIPER, PIM}, f"replies came from {senders or 'nobody'}"
            assert voiced_then_sent, "no voiced line from Juniper"
            assert all(r["params"].get("metadata", {}).get("emotion") for r in replies)
