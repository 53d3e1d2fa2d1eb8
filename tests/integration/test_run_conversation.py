"""Two `companion run` processes (scripted models) hold a conversation to `terminal`, opened by a
message that a bare libp2p node in the test publishes; the node watches every message and states
array as a bystander (the demo's transcript) and no message is answered twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from companion.app.lines import parse_sees
from companion.node import CompanionNode, NodeConfig
from companion.protocol import MESSAGES, Message
from support.live import Bystander, start_companion, stdout_line
from support.live_bridge import blocking
from support.network import network

pytestmark = pytest.mark.integration

JUNIPER = "companion_juniper"
PIM = "companion_pim"


async def test_two_run_processes_talk_until_terminal(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        juniper, j_addr = await blocking(start_companion, net, "juniper", "Juniper", "speak", seed=1)
        pim, p_addr = await blocking(start_companion, net, "pim", "Pim", "speak", j_addr, seed=2)
        # the readiness line: each prints whom it sees once the other joined
        for proc, cid in ((juniper, JUNIPER), (pim, PIM)):
            line = await blocking(
                stdout_line, proc, lambda s, c=cid: parse_sees(s) == (c, frozenset({JUNIPER, PIM})), 30
            )
            assert line.startswith(f"{cid} sees ")

        watcher = Bystander(lambda: [JUNIPER, PIM])
        node = CompanionNode(
            None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), peers=(j_addr, p_addr), name="test")
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run, watcher)
            assert await node.wait_for(lambda: {JUNIPER, PIM} <= set(node.directory), 30)
            opening = Message.create("user_test", [JUNIPER, PIM], "Hello you two! How was the day?")
            # resend with the same id until someone reacts (the mesh forms on a heartbeat)
            started = False
            for _attempt in range(10):
                await node.publish(MESSAGES, opening)
                if await watcher.wait_until(lambda t: any(e.kind != "message" for e in t.events), 3):
                    started = True
                    break
            assert started, "no companion reacted to the opening line"
            assert await watcher.wait_until(lambda t: t.over, 120), [
                (e.kind, e.speaker, e.closing) for e in watcher.lines
            ]
            nursery.cancel_scope.cancel()

    transcript = watcher.transcript
    assert transcript.double_speech == {}
    replies = [e for e in transcript.events if e.kind == "message" and e.in_reply_to]
    assert len(replies) >= 3
    assert {r.speaker for r in replies} == {JUNIPER, PIM}
    assert all(r.text for r in replies)
    assert transcript.events[-1].kind == "end" and transcript.events[-1].reason == "terminal"
    stages = [r.closing for r in replies]
    assert "pre-closing" in stages and stages[-1] == "closing"
