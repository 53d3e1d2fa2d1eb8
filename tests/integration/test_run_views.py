"""The views of ``companion run --ws`` besides the Firehose: ``/history`` from the companions'
stores (what a client shows on connect, reload and late join) and the cards' faces.

The shipped cards (Pim has an image beside its card, Juniper only a colour) with the offline
model in one process; a person's line through the bridge; then a new process on the same data
directory serves the same history, with the same times, from the stores alone.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from companion.app.lines import BRIDGE_LINE
from support.live import start_run, stdout_line
from support.live_bridge import blocking, message_frame
from support.network import network

pytestmark = pytest.mark.integration

CARDS = Path(__file__).resolve().parents[2] / "cards"
PIM, JUNIPER = "companion_pim", "companion_juniper"


def get(url: str) -> tuple[int, str, bytes]:
    """GET ``url``: status, content type, body (an error status is an answer, not a failure)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


async def history(base: str, query: str = "?token=tok&limit=50") -> list[dict[str, Any]]:
    status, kind, body = await blocking(get, f"{base}/history{query}")
    assert status == 200 and kind.startswith("application/json"), (status, body[:200])
    messages: list[dict[str, Any]] = json.loads(body)["messages"]
    return messages


async def test_history_and_faces_are_served_from_the_stores_and_cards(tmp_path: Path) -> None:
    cards = [CARDS / "pim.yaml", CARDS / "juniper.yaml"]
    extra = ("--ws", "127.0.0.1:0", "--token", "tok", "--no-webrtc", "--no-voice")
    with network(tmp_path) as net:
        home = await blocking(start_run, net, "home", cards, extra=extra)
        line = await blocking(stdout_line, home, lambda s: s.startswith(BRIDGE_LINE), 30)
        ws_url = line[len(BRIDGE_LINE) :].strip()
        base = "http://" + ws_url.split("//", 1)[1].split("/", 1)[0]

        # the same access rules as the WebSocket: no token, no history
        assert (await blocking(get, f"{base}/history"))[0] == 401
        assert (await blocking(get, f"{base}/history?token=tok&limit=x"))[0] == 400

        opening = message_frame("user_mika", [PIM, JUNIPER], "Hello both, what are you making?", "open-1")
        async with open_websocket_url(ws_url if "?" in ws_url else f"{ws_url}?token=tok") as ws:
            replies: set[str] = set()
            with trio.fail_after(60):
                while len(replies) < 2:
                    await ws.send_message(opening)  # again until the gossip mesh carries it
                    with trio.move_on_after(3):
                        while len(replies) < 2:
                            frame = json.loads(await ws.get_message())
                            params = frame.get("params", {}) if isinstance(frame, dict) else {}
                            if frame.get("method") == "message.send" and params.get("from") in (PIM, JUNIPER):
                                replies.add(params["id"])
        served = await history(base)
        ids = [item["message"]["params"]["id"] for item in served]
        assert ids[0] == "open-1" and replies <= set(ids), ids
        assert len(ids) == len(set(ids)), "a message twice in the history"
        times = [item["at"] for item in served]
        assert all(isinstance(t, float) for t in times) and times == sorted(times)
        assert len(await history(base, "?token=tok&limit=2")) == 2  # bounded by the client's limit

        status, _, body = await blocking(get, f"{base}/appearance?token=tok")
        faces = json.loads(body)["companions"]
        assert status == 200 and faces[JUNIPER] == {"color": "#4a6fa5", "image": None}
        assert faces[PIM]["image"] == f"/faces/{PIM}" and faces[PIM]["color"] == "#d6824a"
        status, kind, image = await blocking(get, f"{base}{faces[PIM]['image']}?token=tok")
        assert (status, kind, image) == (200, "image/png", (CARDS / "pim.png").read_bytes())
        assert (await blocking(get, f"{base}/faces/{PIM}"))[0] == 401

        # a restart: the history comes from the stores on disk, the same messages at the same times
        assert home.stop() == 0
        again = await blocking(start_run, net, "home", cards, extra=extra)
        line = await blocking(stdout_line, again, lambda s: s.startswith(BRIDGE_LINE), 30)
        base = "http://" + line[len(BRIDGE_LINE) :].strip().split("//", 1)[1].split("/", 1)[0]
        after = await history(base)
        assert [(i["at"], i["message"]["params"]["id"]) for i in after][: len(served)] == list(
            zip(times, ids, strict=True)
        )
