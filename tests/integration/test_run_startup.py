"""Start-up: a `companion run` process dials its peer before its model is ready, is not present
to others until then, and what reaches it meanwhile is answered once the model is, not lost and
not answered early.

The model is a provider model on the fake OpenAI server, whose ``GET /v1/models`` (the start-up
check) is held until the test lets it through, as a server that is slow to come up holds it.
Before this, every model was checked before any node started: the process never dialled while
the check was held (and gave up with exit 2 after the check's deadline)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from companion.conversation.rules import turn_info
from companion.memory import Inbound
from companion.node import CompanionNode, NodeConfig
from companion.protocol import MESSAGES, Message
from support.cards import write_card
from support.fake_llm_server import CooperativeModel, running_server
from support.live import stdout_line
from support.live_bridge import blocking
from support.network import Proc, network

pytestmark = pytest.mark.integration

CID = "companion_early"


class Watcher:
    """The test node's handler: every message, and a wake-up for whoever waits for one."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.changed = trio.Event()

    async def handle(self, inbound: Inbound) -> None:
        if inbound.topic == MESSAGES and isinstance(inbound.payload, Message):
            self.messages.append(inbound.payload)
            self.changed.set()
            self.changed = trio.Event()

    def from_companion(self) -> list[Message]:
        return [m for m in self.messages if m.params.from_ == CID]

    async def reply_to(self, message_id: str, timeout: float) -> Message | None:
        with trio.move_on_after(timeout):
            while True:
                for m in self.from_companion():
                    if turn_info(m).in_reply_to == message_id:
                        return m
                await self.changed.wait()
        return None


async def _until(predicate: object, proc: Proc, timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail at ``timeout`` or as soon as ``proc`` exits."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        tail = proc.tail()
        assert proc.running, f"companion run exited ({proc.popen.returncode}) before {what}:\n{tail}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s:\n{tail}"
        await trio.sleep(0.1)


async def test_run_dials_before_its_model_is_ready_and_answers_what_came_meanwhile(tmp_path: Path) -> None:
    gate = threading.Event()
    model = CooperativeModel()
    with running_server(models_gate=gate) as server, network(tmp_path) as net:
        server.push(*([model] * 100))
        watcher = Watcher()
        node = CompanionNode(None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), name="test"))
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run, watcher)
            argv = [sys.executable, "-m", "companion.cli.run", str(write_card(tmp_path, "early"))]
            argv += ["--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(tmp_path / "data")]
            argv += ["--peer", f"{node.listen_addrs[0]}/p2p/{node.peer_id}"]
            argv += ["--model", "openai:fake-1", "--base-url", server.openai_base_url]
            argv += ["--log-format", "json", "-v"]
            proc = Proc("early", argv)
            net.procs.append(proc)

            # it connects while its model check is held, but its companion is not present yet:
            # no node may count it as a leader of a turn it cannot lead
            await _until(lambda: bool(node.connected_peers), proc, 60, "connection from the companion")
            assert not gate.is_set()
            assert not [line for line in proc.lines if line.startswith(f"{CID} peer ")], "announced too early"

            # a message for it now waits for its engine: taken from the network, not answered
            opening = Message.create("user_test", [CID], "Hello, are you up yet?")
            for _attempt in range(20):  # the same id again until its node took one (the mesh forms)
                await node.publish(MESSAGES, opening)
                if (await blocking(proc.stats))["delivered"] >= 1:
                    break
                await trio.sleep(0.5)
            else:
                raise AssertionError("the opening never reached the companion's node")
            assert await blocking(server.arrived.wait, 30), "the model check never came"
            await trio.sleep(1.0)  # time enough to answer, had anything been there to answer
            assert watcher.from_companion() == [], "answered before its model was ready"
            assert CID not in node.directory, "present before its engine was ready"

            # the model comes up: the companion is announced and answers what came meanwhile
            gate.set()
            await blocking(stdout_line, proc, lambda line: line.startswith(f"{CID} peer "), 30)
            await _until(lambda: CID in node.directory, proc, 10, "the companion's announcement")
            reply = await watcher.reply_to(opening.params.id, 60)
            assert reply is not None, proc.tail()
            assert "user_test" in reply.params.to
            nursery.cancel_scope.cancel()
    assert proc.stop() == 0
