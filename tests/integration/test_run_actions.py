"""Tools run from outside a model, against real ``companion run`` processes on 127.0.0.1.

Wren's process carries the bridge (with a token); Ostra runs in a second process and dials it.
``companion action run`` (a third process) runs Wren's tool in Wren's process, through the
bridge: the envelope reaches Ostra over libp2p, the tool's store counts across calls in Wren's
SQLite, and the exit status says what went wrong. ``POST /actions/TOOL`` without the token is
refused. A tool added to Wren's card while it runs (SIGHUP) is announced: Ostra's engine and a
WebSocket client of the bridge both get the new list, and the new tool runs at once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from companion.app.lines import BRIDGE_LINE, parse_sees
from support.cards import speaking_card, write_card
from support.live import start_run, stdout_line
from support.live_bridge import blocking
from support.network import Proc, network

pytestmark = pytest.mark.integration

WREN, OSTRA = "companion_wren", "companion_ostra"
TOKEN = "t0ken-for-tests"

TOOLS = """\
from pydantic import BaseModel, Field

from companion.actions import ActionContext, action
from companion.protocol import Action


class Lamp(BaseModel):
    brightness: int = Field(ge=0, le=100)


@action(id="lamp", description="Set the lamp.", input=Lamp, timeout=5)
def lamp(ctx: ActionContext[Lamp]) -> Action:
    count = ctx.store.get("count", 0) + 1
    ctx.store.set("count", count)
    return Action.create(ctx.companion_id, "lamp", {"brightness": ctx.input.brightness, "count": count})


class Empty(BaseModel):
    pass


@action(id="wave", description="Wave at everyone.", input=Empty, timeout=5)
def wave(ctx: ActionContext[Empty]) -> Action:
    return Action.create(ctx.companion_id, "wave", {})
"""

CARD = """\
metadata:
  id: companion_wren
  name: Wren
  personality: Keeps the lights of the tea house.
  story: Wren has tended the harbour tea house for years.
  sample: "Mind the step."
role: Keep replies short.
actions: [speak, {tools}]
events:
  params: {{type: object, properties: {{}}}}
  conditions:
    - expression: "true"
      execute: [{{tool: speak, instruction: Reply briefly.}}]
"""


def action_run(card: Path, tool: str, raw: str, port: int, token: str | None = TOKEN) -> tuple[int, Any, str]:
    argv = [sys.executable, "-m", "companion", "action", "run", str(card), tool, "--input", raw]
    argv += ["--bridge", f"http://127.0.0.1:{port}/"] + (["--token", token] if token else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=dict(os.environ))
    printed = json.loads(done.stdout) if done.stdout.strip() else None
    return done.returncode, printed, done.stderr


def post(port: int, tool: str, body: bytes, token: str | None) -> int:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/actions/{tool}", body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def bridge_port(proc: Proc) -> int:
    line = stdout_line(proc, lambda s: s.startswith(BRIDGE_LINE), 30)
    found = re.search(r"ws://127\.0\.0\.1:(\d+)/", line)
    assert found, line
    return int(found.group(1))


def lamps(proc: Proc) -> int:
    """``lamp`` actions from Wren that reached ``proc`` over the network."""
    with proc._cond:
        events = list(proc.events)
    return sum(
        1
        for e in events
        if e.get("event") == "inbound"
        and e.get("topic") == "actions"
        and e.get("sender") == WREN
        and e.get("name") == "lamp"
    )


def peer_tools(proc: Proc, wanted: list[str]) -> None:
    proc.wait_for(
        lambda e: e.get("event") == "peer_tools" and e.get("peer") == WREN and e.get("tools") == wanted,
        40,
        f"Wren's tools {wanted}",
    )


async def test_tools_run_from_the_command_line_and_http_and_changes_are_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "wren_tools.py").write_text(TOOLS)
    monkeypatch.setenv("PYTHONPATH", str(modules))
    card = tmp_path / "wren.yaml"
    card.write_text(CARD.format(tools="wren_tools:lamp"))
    ostra = write_card(tmp_path, "ostra", speaking_card("ostra", "Ostra", "speak"))
    with network(tmp_path) as net:
        home = await blocking(
            start_run, net, "home", [card], extra=("--ws", "127.0.0.1:0", "--no-webrtc", "--token", TOKEN)
        )
        port = await blocking(bridge_port, home)
        addr = str(home.event("started", 5, companion_id=WREN)["addrs"][0])
        away = await blocking(start_run, net, "away", [ostra], addr, seed=3)
        await blocking(stdout_line, away, lambda s: parse_sees(s) == (OSTRA, frozenset({OSTRA, WREN})), 30)
        # Once settled, Wren announces its tools; Ostra's engine keeps the list.
        await blocking(peer_tools, away, ["speak", "lamp"])

        # The command line: the call runs in Wren's process, the envelope reaches Ostra.
        for count in (1, 2):
            code, printed, err = await blocking(action_run, card, "lamp", '{"brightness": 40}', port)
            assert code == 0, err
            assert printed["status"] == "ok" and printed["published"] == [
                {"topic": "actions", "name": "lamp"}
            ]
            await blocking(away.wait_for, lambda e, n=count: lamps(away) >= n, 30, f"lamp {count} at Ostra")
            assert home.count("bridge_action_call", tool="lamp", status="ok") == count
        code, printed, err = await blocking(action_run, card, "lamp", '{"brightness": 400}', port)
        assert code == 2 and printed["code"] == -32004 and printed["issues"][0]["path"] == "brightness"
        code, printed, err = await blocking(action_run, card, "lamb", "{}", port)
        assert code == 2 and "available: lamp, speak" in printed["message"]
        code, printed, err = await blocking(action_run, card, "lamp", '{"brightness": 1}', port, "nope")
        assert code == 2 and printed["http_status"] == 401
        # HTTP: the token is required; a client that holds it runs the tool.
        assert await blocking(post, port, "lamp", b'{"brightness": 5}', None) == 401
        assert await blocking(post, port, "lamp", b'{"brightness": 5}', TOKEN) == 200
        assert await blocking(post, port, "lamp", b"\x00\xff", TOKEN) == 400

        # A tool added while Wren runs: announced to the bridge's clients and to Ostra.
        async with open_websocket_url(f"ws://127.0.0.1:{port}/?topics=actions&token={TOKEN}") as ws:
            card.write_text(CARD.format(tools="wren_tools:lamp, wren_tools:wave"))
            home.signal(signal.SIGHUP)
            with trio.fail_after(30):
                while True:
                    frame = json.loads(await ws.get_message())
                    params = frame.get("params", {})
                    if params.get("name") == "companion.tools" and params.get("from") == WREN:
                        announced = params["params"]
                        if announced.get("change") == {"kind": "registered", "tool": "wave"}:
                            break
        assert [t["id"] for t in announced["tools"]] == ["speak", "lamp", "wave"]
        await blocking(peer_tools, away, ["speak", "lamp", "wave"])
        code, printed, err = await blocking(action_run, card, "wave", "{}", port)
        assert code == 0, err
