"""`companion listen` processes against a `companion bridge` process, a raw libp2p peer (claiming
companion_juniper) publishing the thinking and yield signals and a states array, as a speaker
and its leader do.

Two listeners at once, as people run them: one whose standard output is a pipe (a log: the
status becomes a line every few seconds) and one on a pseudo-terminal (the status line is
redrawn in place once a second). Both must show the failure as one line with its reason and
the hostile detail defanged, then the end marker once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import trio

from companion.app.lines import BRIDGE_LINE, parse_sees
from companion.listen.core import END_MARKER
from support.listening import PtyListener, bridge_with_juniper, listen_argv, until
from support.live import start_run, stdout_line
from support.live_bridge import blocking
from support.network import Proc, network

pytestmark = pytest.mark.integration

HOSTILE = '<img src=x onerror="alert(1)">\x1b[2J\x1b]0;pwned\x07 next\nline'
ESC = "\x1b"
CARDS = Path(__file__).resolve().parents[2] / "cards"


def action(sender: str, name: str, params: Mapping[str, object]) -> str:
    body = {
        "jsonrpc": "2.0",
        "method": "action.send",
        "params": {"from": sender, "name": name, "params": params},
    }
    return json.dumps(body)


def state(sender: str, wish: str, importance: float, stage: str) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "method": "state.send",
        "params": {
            "from": sender,
            "state": wish,
            "importance": importance,
            "selected": False,
            "closing": stage,
        },
    }


async def test_listen_shows_thinking_failure_and_end_on_a_pipe_and_a_terminal(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        _bridge, port, raw = await bridge_with_juniper(net)
        argv = listen_argv(port)
        piped = Proc("listen-pipe", argv, events_on="none", stdin=True)
        net.procs.append(piped)
        live = PtyListener(argv)
        try:
            await until("both connected", lambda: any("connected to" in s for s in piped.lines), 30)
            await until("the terminal connected", lambda: "connected to" in live.text(), 30)
            # the bridge counts both clients before the first signal goes out
            await trio.sleep(0.5)

            def publish(topic: str, text: str) -> None:
                raw.send({"op": "publish", "topic": topic, "text": text})

            publish("actions", action("companion_juniper", "companion.thinking", {"in_reply_to": "m-1"}))
            name = "companion_juniper"  # the name the raw peer announces in its metadata
            await until("thinking on the pipe", lambda: f"{name} is thinking… (0 s)" in piped.lines, 15)
            await until("5 s on the pipe", lambda: f"{name} is thinking… (5 s)" in piped.lines, 10)
            thinking_lines = [s for s in piped.lines if "is thinking" in s]
            assert thinking_lines == [f"{name} is thinking… (0 s)", f"{name} is thinking… (5 s)"]
            await until("5 s on the terminal", lambda: f"{name} is thinking… (5 s)" in live.text(), 5)
            screen = live.text()
            for second in range(6):  # redrawn in place, each second once
                assert screen.count(f"\r\x1b[K\x1b[2m{name} is thinking… ({second} s)\x1b[0m") == 1, second

            detail = HOSTILE + " " + "z" * 400
            params = {"in_reply_to": "m-1", "reason": "timeout", "detail": detail}
            publish("actions", action("companion_juniper", "companion.yield", params))
            failed = f"{name} could not answer: the model timed out ("
            await until("the failure on the pipe", lambda: any(s.startswith(failed) for s in piped.lines), 15)
            (line,) = [s for s in piped.lines if s.startswith(failed)]
            assert line.startswith(failed + '<img src=x onerror="alert(1)"> [2J ]0;pwned next line zzz')
            assert line.endswith("…); the turn passes to the next companion")
            await until("the failure on the terminal", lambda: failed in live.text(), 15)

            # the leader's array after the last reply: everyone's stage is terminal
            end = [
                state("companion_juniper", "speak", 6, "terminal"),
                state("companion_pim", "listen", 2, "terminal"),
            ]
            publish("states", json.dumps(end))
            await until("the end marker on the pipe", lambda: END_MARKER in piped.lines, 15)
            await until("the end marker on the terminal", lambda: END_MARKER in live.text(), 15)
            # a terminal yield for the same conversation: its line, no second marker
            params = {"in_reply_to": "m-2", "reason": "terminal"}
            publish("actions", action("companion_juniper", "companion.yield", params))
            over = f"{name} has nothing more to say; the turn passes to the next companion"
            await until("the terminal yield", lambda: over in piped.lines and over in live.text(), 15)
            assert piped.lines.count(END_MARKER) == 1 and live.text().count(END_MARKER) == 1

            assert not [s for s in piped.lines if ESC in s or "\r" in s]  # a log, no redrawing
            screen = live.text()
            assert "pwned" in screen and "\x1b]0;" not in screen and "\x1b[2J" not in screen
        finally:
            live.stop()


async def test_listen_marks_the_end_of_a_real_conversation(tmp_path: Path) -> None:
    """The shipped cards with the offline model in ``companion run --ws``: a person types one
    line, the companions talk until they close, and ``companion listen`` says the conversation
    ended (the last reply is stamped ``closing``; only the leader's array after it, on
    ``states``, says that nobody speaks now). Main's client showed nothing there."""
    cards = [CARDS / "juniper.yaml", CARDS / "pim.yaml"]
    with network(tmp_path) as net:
        home = await blocking(
            start_run, net, "home", cards, extra=("--ws", "127.0.0.1:0", "--no-webrtc", "--no-voice")
        )
        line = await blocking(stdout_line, home, lambda s: s.startswith(BRIDGE_LINE), 30)
        url = line[len(BRIDGE_LINE) :].strip()
        everyone = frozenset({"companion_juniper", "companion_pim"})
        for cid in everyone:
            await blocking(stdout_line, home, lambda s, c=cid: parse_sees(s) == (c, everyone), 30)
        argv = [sys.executable, "-m", "companion", "listen", "--ws", url, "--as", "user_mika"]
        listen = Proc("listen", argv, events_on="none", stdin=True)
        net.procs.append(listen)
        await until("connected", lambda: any("connected to" in s for s in listen.lines), 30)
        assert listen.popen.stdin is not None
        listen.popen.stdin.write("What's the best time to see Saturn?\n")
        listen.popen.stdin.flush()
        await until("the end marker", lambda: END_MARKER in listen.lines, 120)
        # message lines start with the time they were said
        replies = [s for s in listen.lines if s[6:].startswith(("Juniper →", "Pim →")) and s[2] == ":"]
        assert len(replies) >= 2
        assert listen.lines.index(END_MARKER) > listen.lines.index(replies[-1])
        await trio.sleep(1)  # a second leader's array, or a late yield, would come now
        assert listen.lines.count(END_MARKER) == 1
