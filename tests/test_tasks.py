"""Objects that own their tasks (``companion.tasks``): the in-memory hub, the group and the WebRTC
gateway open their own nursery for a block, say how to open them when used closed, and end
their tasks when the block does."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from companion.app.group import MemoryGroup
from companion.memory import MemoryHub
from companion.models.scripted import ScriptedModel
from companion.protocol import MESSAGES, Message
from companion.rtc import RtcGateway
from companion.tasks import OwnsTasks
from support.bridges import bridge_on_hub
from support.engines import make_card

DELAY = 10.0


class Sleeper(OwnsTasks):
    """Starts one task that sleeps until it is cancelled, and notes that it was."""

    def __init__(self) -> None:
        self.cancelled = False

    def start(self) -> None:
        self.tasks.start_soon(self._sleep)

    async def _sleep(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled = True


async def test_leaving_the_block_cancels_the_tasks_and_it_opens_once_at_a_time() -> None:
    sleeper = Sleeper()
    async with sleeper:
        sleeper.start()
        await trio.testing.wait_all_tasks_blocked()
        assert not sleeper.cancelled
        with pytest.raises(RuntimeError, match="open already"):
            await sleeper.__aenter__()
    assert sleeper.cancelled
    with pytest.raises(RuntimeError, match=r"async with Sleeper\(\.\.\.\)"):
        sleeper.start()
    async with sleeper:  # open again, later
        sleeper.start()


async def test_a_closed_group_or_gateway_says_how_to_open_it() -> None:
    with pytest.raises(RuntimeError, match=r"async with MemoryGroup\(\.\.\.\)"):
        await MemoryGroup().add(make_card(0), ScriptedModel(0))
    async with trio.open_nursery() as nursery:
        net = bridge_on_hub(nursery)
        gateway = RtcGateway(net.bridge, net.node)
        with pytest.raises(RuntimeError, match=r"async with RtcGateway\(\.\.\.\)"):
            _ = gateway.island
        async with gateway:
            assert gateway.island is not None and not gateway.closed
        assert gateway.closed and gateway.running == 0  # no offer is accepted once the block ended
        with pytest.raises(RuntimeError, match="not open"):
            _ = gateway.island
        nursery.cancel_scope.cancel()


async def late(topic: str, receiver: str, data: bytes) -> list[bytes]:
    """A fault hook that delays every delivery by :data:`DELAY`."""
    await trio.sleep(DELAY)
    return [data]


async def test_an_open_hub_delays_only_the_receiver_its_fault_delays(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def fault(topic: str, receiver: str, data: bytes) -> list[bytes]:
        if receiver == "slow":
            await trio.sleep(DELAY)
        return [data]

    async with MemoryHub(fault=fault) as hub:
        sender, fast, slow = hub.endpoint("sender"), hub.endpoint("fast"), hub.endpoint("slow")
        start = trio.current_time()
        await sender.publish(MESSAGES, Message.create("user_a", ["companion_b"], "hello"))
        assert trio.current_time() == start  # the publisher waits for nobody
        await fast.receive_channel.receive()
        assert trio.current_time() == start
        await slow.receive_channel.receive()
        assert trio.current_time() - start == pytest.approx(DELAY)


async def test_leaving_an_open_hub_drops_the_deliveries_still_delayed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with MemoryHub(fault=late) as hub:
        sender, receiver = hub.endpoint("sender"), hub.endpoint("receiver")
        await sender.publish(MESSAGES, Message.create("user_a", ["companion_b"], "hello"))
    await trio.sleep(2 * DELAY)
    with pytest.raises(trio.WouldBlock):
        receiver.receive_channel.receive_nowait()


async def test_a_hub_not_open_runs_the_fault_in_the_publishers_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = MemoryHub(fault=late)
    sender, receiver = hub.endpoint("sender"), hub.endpoint("receiver")
    start = trio.current_time()
    await sender.publish(MESSAGES, Message.create("user_a", ["companion_b"], "hello"))
    assert trio.current_time() - start == pytest.approx(2 * DELAY)  # one receiver after another
    receiver.receive_channel.receive_nowait()
