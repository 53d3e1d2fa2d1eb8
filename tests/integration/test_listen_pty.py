"""`companion listen` in a pseudo-terminal that is both its keyboard and its screen, as a person
runs it: what the person is typing stays whole while companions' lines arrive, a reply that
addresses only the person ends the conversation (the end marker), and when the bridge
restarts on the same port the client reconnects by itself and goes on.

A `companion bridge` process, a raw libp2p peer speaking as companion_juniper, and a second
Firehose client that receives what the person sends (clients see each other's frames).
"""

from __future__ import annotations

import json
import re
import signal
import termios
from pathlib import Path

import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from companion.listen.core import END_MARKER
from support.listening import PtyListener, bridge_with_juniper, listen_argv, until
from support.live_bridge import blocking, start_bridge
from support.network import Proc, network

pytestmark = pytest.mark.integration

STYLE = re.compile(r"\x1b\[[0-9;]*m")


class Typed:
    """The listener's terminal as the person sees it: its text without colours (the cursor
    movements stay), and the keys typed."""

    def __init__(self, listener: PtyListener) -> None:
        self.listener = listener

    def text(self) -> str:
        return STYLE.sub("", self.listener.text())

    def type(self, keys: str) -> None:
        self.listener.type(keys)


async def said_by_the_person(ws: WebSocketConnection, timeout: float = 15) -> str:
    """The next line user_mika sends, as another client of the bridge receives it."""
    with trio.fail_after(timeout):
        while True:
            frame = json.loads(await ws.get_message())
            params = frame.get("params", {}) if isinstance(frame, dict) else {}
            if frame.get("method") == "message.send" and params.get("from") == "user_mika":
                return str(params["message"])


async def counted_beside_the_listener(bridge: Proc) -> None:
    """Until the bridge has counted a second client (the test's, after the listener): a line
    sent before would not reach it."""
    await blocking(bridge.wait_for, lambda e: e.get("event") == "client_connected" and e["clients"] >= 2, 15)


async def test_typing_survives_arriving_lines_the_end_and_a_bridge_restart(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        bridge, port, raw = await bridge_with_juniper(net)
        listener = PtyListener(listen_argv(port), keyboard=True)
        term = Typed(listener)
        try:
            await until("connected", lambda: "connected to" in term.text(), 30)
            await until("the prompt", lambda: term.text().rstrip().endswith(">"), 10)
            term.type("hello wor")
            await until("the typed text drawn", lambda: "> hello wor" in term.text(), 10)

            # Juniper answers the person alone while she types: its line above, her text intact
            reply = {
                "jsonrpc": "2.0",
                "method": "message.send",
                "params": {
                    "id": "r-1",
                    "from": "companion_juniper",
                    "to": ["user_mika"],
                    "message": "Good night, Mika.",
                    "metadata": {"in_reply_to": "m-0"},
                },
            }
            raw.send({"op": "publish", "topic": "messages", "text": json.dumps(reply)})
            await until("the end marker", lambda: END_MARKER in term.text(), 15)
            screen = term.text()
            line = screen.rfind("companion_juniper → you: Good night, Mika.")
            assert line > 0, screen[-400:]
            # a time first, then the line; the typed row drawn again after the end marker
            assert screen[line - 6 : line - 3].endswith(":") or screen[line - 4] == ":", screen[
                line - 20 : line
            ]
            assert screen.rfind("> hello wor") > screen.rfind(END_MARKER)

            async with open_websocket_url(f"ws://127.0.0.1:{port}/") as ws:
                await counted_beside_the_listener(bridge)  # before the line goes out
                term.type("ld\r")
                assert await said_by_the_person(ws) == "hello world"
            # it stays in the log (drawn when the listener's own send is done, which may be
            # after the other client received it)
            await until("the sent line kept", lambda: "> hello world\r\n" in term.text(), 10)

            # the bridge restarts on the same port: the client reconnects by itself
            bridge.stop()
            await until("reconnecting", lambda: "reconnecting to" in term.text(), 15)
            term.type("after the ")  # typed while the bridge is away
            bridge2, _, _ = await blocking(start_bridge, net, "bridge2", extra=("--ws", f"127.0.0.1:{port}"))
            await until("reconnected", lambda: "reconnected to" in term.text(), 30)
            assert term.text().rfind("> after the ") > term.text().rfind("reconnected to")
            async with open_websocket_url(f"ws://127.0.0.1:{port}/") as ws:
                await counted_beside_the_listener(bridge2)
                term.type("restart\r")
                assert await said_by_the_person(ws) == "after the restart"
            assert listener.popen.poll() is None

            # it reads the keys itself (no echo by the terminal); SIGTERM, like Ctrl-C, puts the
            # terminal's settings back as they were
            assert not termios.tcgetattr(listener.master)[3] & termios.ECHO
            listener.popen.send_signal(signal.SIGTERM)
            assert await blocking(listener.popen.wait, 15) == 128 + signal.SIGTERM
            assert termios.tcgetattr(listener.master)[3] & termios.ECHO
        finally:
            listener.stop()
