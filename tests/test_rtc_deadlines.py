"""Every wait in the WebRTC layer has a deadline; each one is exercised here (all on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from companion.memory import MemoryEndpoint, Publisher
from companion.protocol import MESSAGES, QUERIES, Envelope, Message, Query, State
from companion.rtc import (
    ClientSettings,
    RtcGateway,
    SessionSettings,
    Signaler,
    connect_rtc,
    host_addresses,
)
from companion.voice import Speech
from support.bridges import bridge_on_hub


@asynccontextmanager
async def gateway_on_hub(
    settings: SessionSettings, *, publisher: Publisher | None = None, **kwargs: object
) -> AsyncIterator[tuple[RtcGateway, MemoryEndpoint]]:
    async with trio.open_nursery() as nursery:
        net = bridge_on_hub(nursery)
        async with RtcGateway(
            net.bridge,
            publisher or net.node,
            settings=settings,
            **kwargs,  # type: ignore[arg-type]
        ) as gateway:
            yield gateway, net.companion
        nursery.cancel_scope.cancel()


def signal_to(gateway: RtcGateway) -> Signaler:
    async def signal(body: bytes) -> tuple[int, bytes | str]:
        reply = await gateway.offer(body)
        return reply.status, reply.body

    return signal


async def wait_empty(gateway: RtcGateway, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        await gateway.wait_for_sessions(0)


async def _pc() -> RTCPeerConnection:
    return RTCPeerConnection(RTCConfiguration(iceServers=[]))


async def an_offer(gateway: RtcGateway) -> tuple[RTCPeerConnection, str]:
    """A real offer from a peer connection the test controls."""
    island = gateway.island
    island.enter()
    pc = await island.call(_pc)
    pc.createDataChannel("firehose")
    with host_addresses(("127.0.0.1",)):
        await island.call(pc.setLocalDescription, await island.call(pc.createOffer))
    return pc, json.dumps({"type": "offer", "sdp": pc.localDescription.sdp})


async def test_negotiation_has_a_deadline() -> None:
    async with gateway_on_hub(SessionSettings(negotiate_timeout=0)) as (gateway, _):
        before = gateway.island.asyncio_tasks()
        pc, offer = await an_offer(gateway)
        reply = await gateway.offer(offer)
        assert reply.status == 400 and json.loads(reply.body)["error"]["code"] == "negotiation_failed"
        assert not gateway.sessions
        await gateway.island.call(pc.close)
        assert not gateway.island.asyncio_tasks() - before


async def test_the_gateway_refuses_offers_beyond_its_limit() -> None:
    async with (
        gateway_on_hub(SessionSettings(), max_sessions=1) as (gateway, _),
        connect_rtc(signal_to(gateway), voice=False),
    ):
        _, offer = await an_offer(gateway)
        reply = await gateway.offer(offer)
        assert reply.status == 503 and json.loads(reply.body)["error"]["code"] == "busy"


async def test_closing_the_peer_connection_has_a_deadline() -> None:
    async with (
        gateway_on_hub(SessionSettings(close_timeout=0.2)) as (gateway, _),
        connect_rtc(signal_to(gateway), voice=False),
    ):
        session = next(iter(gateway.sessions.values()))
        pc = session._pc
        assert pc is not None
        real_close = pc.close

        async def never_closes() -> None:
            await asyncio.sleep(3600)

        pc.close = never_closes  # type: ignore[method-assign]
        session.close("test")
        await wait_empty(gateway, timeout=5)  # teardown gave up on the close after 0.2 s
        assert session.end_reason == "test"
        await gateway.island.call(real_close)


async def test_a_client_that_stops_acknowledging_is_dropped_when_its_buffer_stalls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = SessionSettings(send_high_water=16 * 1024, send_stall_timeout=0.5)
    async with (
        gateway_on_hub(settings) as (gateway, companion),
        connect_rtc(signal_to(gateway), voice=False) as client,
    ):
        session = next(iter(gateway.sessions.values()))
        # the client stops acknowledging (its ICE sockets go quiet); consent would take 30 s
        pc = client._pc
        assert pc is not None and pc.sctp is not None
        for protocol in pc.sctp.transport.transport._connection._protocols:
            monkeypatch.setattr(protocol.transport, "sendto", lambda *args, **kwargs: None)
            monkeypatch.setattr(protocol, "datagram_received", lambda data, addr: None)
        for n in range(60):
            text = f"{n} " + "x" * 2000
            await companion.publish(MESSAGES, Message.create("companion_aya", ["user_kai"], text))
        await wait_empty(gateway, timeout=10)
        assert session.end_reason is not None and "too slow" in session.end_reason, session.end_reason


class HangingPublisher:
    """A network that never accepts a query result."""

    def __init__(self, inner: Publisher) -> None:
        self.inner = inner
        self.attempts = 0
        self.second_attempt = trio.Event()

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        if topic == QUERIES:
            self.attempts += 1
            if self.attempts == 2:
                self.second_attempt.set()
            await trio.sleep_forever()
        await self.inner.publish(topic, envelope)


class QuickSynth:
    name = "quick"

    async def synthesize(self, text: str, *, emotion: str | None = None) -> Speech:
        await trio.lowlevel.checkpoint()
        return Speech(b"\x10\x27" * 4800, 48000)  # 0.1 s of a constant level


async def test_publishing_a_result_has_a_deadline() -> None:
    settings = SessionSettings(publish_timeout=0.2)
    async with trio.open_nursery() as nursery:
        net = bridge_on_hub(nursery)
        companion, hanging = net.companion, HangingPublisher(net.node)
        async with (
            RtcGateway(net.bridge, hanging, synthesizer=QuickSynth(), settings=settings) as gateway,
            connect_rtc(signal_to(gateway)) as client,
        ):
            for n in range(2):
                await companion.publish(
                    QUERIES, Query.create("companion_aya", "speak", {"message": f"line {n}"})
                )
            with trio.fail_after(10):  # the second result is tried after the first gave up
                await hanging.second_attempt.wait()
            assert client.close_reason is None
        nursery.cancel_scope.cancel()


async def test_the_client_gives_up_on_a_bridge_that_never_answers() -> None:
    async def accept_and_stall(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, accept_and_stall, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        start = trio.current_time()
        with pytest.raises(trio.TooSlowError):
            async with connect_rtc(f"http://127.0.0.1:{port}", settings=ClientSettings(http_timeout=0.3)):
                pass
        assert trio.current_time() - start < 5
        nursery.cancel_scope.cancel()


async def test_the_client_gives_up_when_the_data_channel_never_opens() -> None:
    async with gateway_on_hub(SessionSettings()) as (gateway, _):
        island = gateway.island

        async def vanishing_answerer(body: bytes) -> tuple[int, bytes | str]:
            """Answers like a bridge, then is gone before ICE."""
            island.enter()
            pc = await island.call(_pc)
            await island.call(
                pc.setRemoteDescription, RTCSessionDescription(json.loads(body)["sdp"], "offer")
            )
            with host_addresses(("127.0.0.1",)):
                await island.call(pc.setLocalDescription, await island.call(pc.createAnswer))
            sdp = pc.localDescription.sdp
            await island.call(pc.close)
            return 200, json.dumps({"type": "answer", "sdp": sdp, "session": "gone", "voice": False})

        with pytest.raises(trio.TooSlowError):
            async with connect_rtc(
                vanishing_answerer, voice=False, settings=ClientSettings(connect_timeout=0.5)
            ):
                pass
