"""``stop_in_order`` (``companion.app.stopping``) with stand-ins for the companions, nodes and
clients: the steps in their order, and the clients closed only once the messages sent while the
turns stopped were written to them, or after :data:`CLIENTS_CATCH_UP` seconds."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, cast

import trio
import trio.testing

from companion.app.stopping import CLIENTS_CATCH_UP, stop_in_order


class FakeNode:
    def __init__(
        self, log: list[str], name: str, clients: trio.CancelScope, sent: Iterable[str] = ()
    ) -> None:
        self.log, self.name, self.clients = log, name, clients
        self.messages_sent: deque[str] = deque(sent, maxlen=64)

    async def stop(self) -> None:
        assert self.clients.cancel_called  # the clients are closed before the nodes stop
        self.log.append(f"node {self.name} stopped")


class FakeCompanion:
    """Its stop publishes a reply through its node (a reply that finished within the grace)."""

    def __init__(self, log: list[str], node: FakeNode, reply: str | None) -> None:
        self.log, self.node, self.reply = log, node, reply

    async def stop(self, grace: float) -> None:
        await trio.sleep(0.5)
        if self.reply is not None:
            self.node.messages_sent.append(self.reply)
        self.log.append(f"turns of {self.node.name} stopped")

    async def close(self) -> None:
        self.log.append(f"files of {self.node.name} closed")


async def _stop(arrives: float | None) -> tuple[list[str], trio.CancelScope]:
    """Two companions, one of which replies while stopping; the reply reaches the clients
    ``arrives`` seconds after it is asked for (``None``: never). What happened, in order, and
    the clients' scope."""
    log: list[str] = []
    clients = trio.CancelScope()
    nodes = [FakeNode(log, "pim", clients, ["m-old"]), FakeNode(log, "ostra", clients)]
    companions = [FakeCompanion(log, nodes[0], "m-reply"), FakeCompanion(log, nodes[1], None)]
    asked: list[list[str]] = []

    async def written(ids: Iterable[str], timeout: float) -> bool:
        asked.append(list(ids))
        assert not clients.cancel_called
        with trio.move_on_after(timeout):
            await trio.sleep(float("inf") if arrives is None else arrives)
            log.append("clients read the reply")
            return True
        return False

    await stop_in_order(cast(Any, companions), cast(Any, nodes), clients=clients, written=written)
    assert asked == [["m-reply"]]  # only what was sent during the stop
    return log, clients


async def test_the_clients_close_after_the_reply_sent_while_stopping_reached_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log, clients = await _stop(arrives=0.3)
    steps = ["turns of", "clients read the reply", "node", "files of"]
    order = [next(i for i, step in enumerate(steps) if entry.startswith(step)) for entry in log]
    assert order == sorted(order) and len(log) == 7 and clients.cancel_called, log


async def test_a_reply_that_never_reaches_the_clients_delays_the_stop_by_the_bound_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started = trio.current_time()
    log, clients = await _stop(arrives=None)
    assert "clients read the reply" not in log and clients.cancel_called
    assert trio.current_time() - started <= 0.5 + CLIENTS_CATCH_UP + 0.01
