"""WebRTC sessions on 127.0.0.1: an aiortc client, the gateway and the bridge on an in-memory network.

The offer goes to the gateway in-process (the HTTP route and real node processes are covered
in ``tests/integration/test_webrtc*.py``). The companion is a test actor that sends ``speak``
queries the way aikyo's speak tool does and waits for their results.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import aioice.ice
import pytest
import trio

from companion.bridge import Bridge
from companion.memory import MemoryEndpoint, MemoryHub
from companion.protocol import MESSAGES, QUERIES, Message, Query, QueryResult, encode, parse_payload
from companion.rtc import (
    ClientClosed,
    ClientSettings,
    OfferRejected,
    ReceivedAudio,
    RtcClient,
    RtcGateway,
    SessionSettings,
    connect_rtc,
)
from companion.rtc.session import RtcSession
from companion.rtc.voicequeue import FRAME_SECONDS
from companion.voice import EspeakSynthesizer, Speech, SynthesisError, Synthesizer
from support.bridges import bridge_on_hub
from support.clients import drain_audio, needs_espeak

COMPANION = "companion_aya"
LONG_LINE = "This is a long line that the companion says slowly, so that there is time to interrupt it. " * 3

C = TypeVar("C")
T = TypeVar("T")


@dataclass
class Net:
    hub: MemoryHub
    bridge: Bridge
    gateway: RtcGateway
    companion: MemoryEndpoint
    skipped: list[object] = field(default_factory=list)

    async def signal(self, body: bytes) -> tuple[int, bytes | str]:
        reply = await self.gateway.offer(body)
        return reply.status, reply.body

    async def next_payload(self, kind: type, timeout: float = 10) -> object:
        """The next payload of ``kind`` others published; the rest is kept for later calls."""
        for i, payload in enumerate(self.skipped):
            if isinstance(payload, kind):
                return self.skipped.pop(i)
        with trio.fail_after(timeout):
            async for inbound in self.companion.receive_channel:
                if inbound.sender_peer == self.companion.name:
                    continue
                if isinstance(inbound.payload, kind):
                    return inbound.payload
                self.skipped.append(inbound.payload)
        raise AssertionError("hub closed")


@asynccontextmanager
async def network(
    synthesizer: Synthesizer | None = None, settings: SessionSettings | None = None
) -> AsyncIterator[Net]:
    """A companion and a bridge on an in-memory network; the bridge's WebRTC gateway."""
    async with trio.open_nursery() as nursery:
        net = bridge_on_hub(nursery)
        async with RtcGateway(
            net.bridge,
            net.node,
            synthesizer=synthesizer,
            settings=settings or SessionSettings(connect_timeout=5),
        ) as gateway:
            yield Net(net.hub, net.bridge, gateway, net.companion)
        nursery.cancel_scope.cancel()


def speak_query(text: str) -> Query:
    return Query.create(COMPANION, "speak", {"message": text, "emotion": "happy"})


async def next_frame(client: RtcClient, timeout: float = 10) -> dict[str, object]:
    with trio.fail_after(timeout):
        return json.loads(await client.receive_text())  # type: ignore[no-any-return]


async def first_audible(client: RtcClient, timeout: float = 10) -> ReceivedAudio:
    with trio.fail_after(timeout):
        async for frame in client.audio:
            if frame.peak > 500:
                return frame
    raise AssertionError("audio ended")


def leading_silence(speech: Speech, threshold: int = 500) -> float:
    samples = memoryview(speech.pcm).cast("h")
    for i, value in enumerate(samples):
        if abs(value) > threshold:
            return i / speech.sample_rate
    return speech.duration


def receiving_lag(frames: list[ReceivedAudio]) -> float:
    """Seconds the client's receiving fell behind the sender over ``frames`` (consecutive 20 ms
    frames), from the first audible one to the last: the time between their arrivals beyond the
    audio between them. About 0 on a quiet machine; under load the client (one hop between
    threads per frame) holds a backlog that arrives after the result although it was sent before.
    A result sent at the start of the line still fails the test: its frames arrive at the
    sender's pace, so there is no lag to allow for."""
    audible = [i for i, f in enumerate(frames) if f.peak > 500]
    if len(audible) < 2:
        return 0.0
    first, last = audible[0], audible[-1]
    spent = frames[last].received_at - frames[first].received_at
    return max(0.0, spent - (last - first) * FRAME_SECONDS)


async def until_quiet(client: RtcClient, frames: int = 30, timeout: float = 10) -> list[ReceivedAudio]:
    """Audio frames received until ``frames`` silent ones in a row."""
    out: list[ReceivedAudio] = []
    quiet = 0
    with trio.fail_after(timeout):
        async for frame in client.audio:
            out.append(frame)
            quiet = quiet + 1 if frame.peak < 50 else 0
            if quiet >= frames:
                return out
    raise AssertionError("audio ended")


async def test_data_channel_carries_firehose_frames_both_ways() -> None:
    async with network() as net, connect_rtc(net.signal, voice=False) as client:
        assert client.voice is False
        hello = Message.create("user_kai", [COMPANION], "hello over webrtc")
        await client.send_json({"topic": MESSAGES, "body": json.loads(encode(hello))})
        got = await net.next_payload(Message)
        assert got == hello
        reply = Message.create(COMPANION, ["user_kai"], "hi!", metadata={"emotion": "happy"})
        await net.companion.publish(MESSAGES, reply)
        frame = await next_frame(client)
        assert parse_payload(MESSAGES, json.dumps(frame).encode()) == reply
        await client.send_text("not json")
        error = await next_frame(client)
        assert "error" in error
        assert len(net.gateway.sessions) == 1


async def test_offer_refusals_reach_the_client() -> None:
    async with network() as net:
        with pytest.raises(OfferRejected) as info:
            async with connect_rtc(net.signal, voice=False, topics=["gossip"]):
                pass
        assert info.value.code == "unknown_topic"
        reply = await net.gateway.offer(
            json.dumps({"type": "offer", "sdp": "v=0\r\nm=application 9 x\r\nbroken"})
        )
        assert reply.status == 400 and json.loads(reply.body)["error"]["code"] == "negotiation_failed"
        assert not net.gateway.sessions
        assert not net.gateway.island.asyncio_tasks()


@needs_espeak
async def test_speak_query_is_heard_before_its_result_arrives() -> None:
    synth = EspeakSynthesizer()
    async with network(synth) as net, connect_rtc(net.signal, voice=True) as client:
        assert client.voice is True
        line = "Hello, I am Aya. Nice to meet you."
        expected = await synth.synthesize(line, emotion="happy")
        query = speak_query(line)
        await net.companion.publish(QUERIES, query)
        frame = await next_frame(client)
        assert frame["id"] == query.id  # the client sees the query too, exactly as over WebSocket
        first = await first_audible(client)
        result = await net.next_payload(QueryResult)
        answered = time.monotonic()
        assert isinstance(result, QueryResult) and result.id == query.id
        assert result.result is not None and result.result.success
        assert result.result.body["spoken"] is True
        frames = [first, *await until_quiet(client)]
        audible = [f for f in frames if f.peak > 500]
        # the line's audio was received before its result: at most a jitter buffer's worth of
        # audible frames (100 ms) trails the result, and the frames received before the result
        # cover the line from its first audible frame (espeak starts with a little silence)
        # (plus what the client's own receiving fell behind over the line, on a loaded machine)
        line_seconds = expected.duration - leading_silence(expected)
        behind = min(receiving_lag(frames), line_seconds / 4) / FRAME_SECONDS
        late = [f for f in audible if f.received_at > answered]
        assert len(late) <= 5 + behind, f"{len(late)} audible frames arrived after the result ({behind=})"
        before = [f for f in frames if f.received_at <= answered]
        assert len(before) + behind >= 0.9 * line_seconds / FRAME_SECONDS, (len(before), line_seconds, behind)
        session = next(iter(net.gateway.sessions.values()))
        assert session.stats.lines_spoken == 1
        assert len(session.stats.speak_latencies) == 1


@needs_espeak
async def test_without_opus_the_track_sends_pcm_for_aiortc_to_encode() -> None:
    pcmu = ClientSettings(audio_codec="PCMU")
    async with network(EspeakSynthesizer()) as net, connect_rtc(net.signal, settings=pcmu) as client:
        session = next(iter(net.gateway.sessions.values()))
        assert session._track is not None and not session._track.encoded
        q = speak_query("Plain old telephone audio.")
        await net.companion.publish(QUERIES, q)
        heard = await first_audible(client)
        assert heard.sample_rate == 8000  # decoded from G.711
        result = await net.next_payload(QueryResult)
        assert isinstance(result, QueryResult) and result.result is not None and result.result.success


@needs_espeak
async def test_lines_play_in_order_and_each_result_follows_its_audio() -> None:
    async with network(EspeakSynthesizer()) as net, connect_rtc(net.signal) as client:
        queries = [speak_query(f"Line number {n}.") for n in range(3)]
        for q in queries:
            await net.companion.publish(QUERIES, q)
        results = [await net.next_payload(QueryResult) for _ in queries]
        assert [r.id for r in results] == [q.id for q in queries]  # type: ignore[attr-defined]
        assert all(r.result is not None and r.result.success for r in results)  # type: ignore[attr-defined]
        assert [f for f in drain_audio(client) if f.peak > 500]


@needs_espeak
async def test_stop_frame_interrupts_the_line_and_flushes_the_queue() -> None:
    async with network(EspeakSynthesizer()) as net, connect_rtc(net.signal) as client:
        playing, queued = speak_query(LONG_LINE), speak_query("never said")
        await net.companion.publish(QUERIES, playing)
        await net.companion.publish(QUERIES, queued)
        await first_audible(client)
        await client.stop_speech()
        results = [await net.next_payload(QueryResult) for _ in range(2)]
        assert {r.id for r in results} == {playing.id, queued.id}  # type: ignore[attr-defined]
        for r in results:
            assert r.result is not None and not r.result.success  # type: ignore[attr-defined]
            assert r.result.body == {"interrupted": True, "reason": "stop"}  # type: ignore[attr-defined]
        # after the frames already in flight, the track is silent again
        await until_quiet(client)


@needs_espeak
async def test_a_new_message_from_the_person_flushes_the_voice() -> None:
    async with network(EspeakSynthesizer()) as net, connect_rtc(net.signal) as client:
        playing = speak_query(LONG_LINE)
        await net.companion.publish(QUERIES, playing)
        await first_audible(client)
        hello = Message.create("user_kai", [COMPANION], "wait, a question")
        await client.send_json({"topic": MESSAGES, "body": json.loads(encode(hello))})
        result = await net.next_payload(QueryResult)
        assert isinstance(result, QueryResult) and result.result is not None
        assert result.result.body == {"interrupted": True, "reason": "new message"}
        assert await net.next_payload(Message) == hello


@dataclass
class BrokenSynth:
    name: str = "broken"

    async def synthesize(self, text: str, *, emotion: str | None = None) -> Speech:
        raise SynthesisError("failed", "no voice for this line")


async def test_synthesis_failure_is_answered_as_an_error() -> None:
    async with network(BrokenSynth()) as net, connect_rtc(net.signal) as client:
        q = speak_query("hello")
        await net.companion.publish(QUERIES, q)
        result = await net.next_payload(QueryResult)
        assert isinstance(result, QueryResult) and result.id == q.id
        assert result.error is not None and "no voice for this line" in result.error
        assert client.close_reason is None


@needs_espeak
async def test_voice_can_be_switched_on_later_without_renegotiating() -> None:
    async with (
        network(EspeakSynthesizer()) as net,
        connect_rtc(net.signal, voice=False, audio=True) as client,
    ):
        assert client.voice is False
        first = speak_query("not spoken")
        await net.companion.publish(QUERIES, first)
        assert (await next_frame(client))["id"] == first.id
        await client.set_voice(True)
        assert await next_frame(client) == {"control": "voice", "enabled": True}
        second = speak_query("Now I can be heard.")
        await net.companion.publish(QUERIES, second)
        await first_audible(client)
        result = await net.next_payload(QueryResult)
        assert isinstance(result, QueryResult) and result.id == second.id  # the first was left alone


async def test_voice_off_leaves_speak_queries_to_the_client() -> None:
    async with network(BrokenSynth()) as net, connect_rtc(net.signal) as client:
        await client.set_voice(False)
        assert await next_frame(client) == {"control": "voice", "enabled": False}
        await client.send_json({"control": "dance"})
        error = await next_frame(client)
        assert error["error"]["code"] == "invalid_control"  # type: ignore[index]
        q = speak_query("hello")
        await net.companion.publish(QUERIES, q)
        assert (await next_frame(client))["id"] == q.id
        with trio.move_on_after(0.5):
            result = await net.next_payload(QueryResult)
            raise AssertionError(f"the session answered although voice is off: {result}")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def wait_for_no_sessions(gateway: RtcGateway, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        await gateway.wait_for_sessions(0)


async def speaking_a_long_line(net: Net, client: RtcClient) -> tuple[Query, RtcSession]:
    """The companion asks for a long line and the client hears it start: the query, and the
    client's session (mid-speech)."""
    q = speak_query(LONG_LINE)
    await net.companion.publish(QUERIES, q)
    await first_audible(client)
    return q, next(iter(net.gateway.sessions.values()))


@needs_espeak
async def test_client_leaving_mid_speech_leaves_nothing_running() -> None:
    async with network(EspeakSynthesizer()) as net:
        tasks_before, fds_before = net.gateway.island.asyncio_tasks(), open_fds()
        async with connect_rtc(net.signal) as client:
            q, session = await speaking_a_long_line(net, client)
            assert net.gateway.island.asyncio_tasks() - tasks_before
        # the client left mid-speech: the session notices, answers the query, and cleans up
        result = await net.next_payload(QueryResult)
        assert isinstance(result, QueryResult) and result.id == q.id
        assert result.result is not None and result.result.body["interrupted"] is True
        await wait_for_no_sessions(net.gateway)
        assert session.end_reason is not None and "closed" in session.end_reason
        assert session.stats.lines_interrupted == 1
        assert not net.gateway.island.asyncio_tasks() - tasks_before
        assert open_fds() <= fds_before  # UDP sockets closed


@needs_espeak
async def test_trio_cancellation_mid_speech_tears_the_session_down() -> None:
    async with network(EspeakSynthesizer()) as net:
        tasks_before, fds_before = net.gateway.island.asyncio_tasks(), open_fds()
        async with connect_rtc(net.signal) as client:
            q, session = await speaking_a_long_line(net, client)
            net.gateway.cancel_all()  # trio cancellation of every session task (not of this test)
            await wait_for_no_sessions(net.gateway)
            # the bridge's side of the cancelled task closes the client as a shutdown
            assert session.end_reason == "closed by the bridge (1001: bridge shutting down)"
            result = await net.next_payload(QueryResult)
            assert isinstance(result, QueryResult) and result.id == q.id
            assert result.result is not None and result.result.body["interrupted"] is True
            with pytest.raises(ClientClosed), trio.fail_after(10):
                while True:  # the client is told: the bridge's side closed
                    await client.receive_text()
        assert not net.gateway.island.asyncio_tasks() - tasks_before
        assert open_fds() <= fds_before


async def test_closing_the_gateway_ends_its_sessions() -> None:
    async with network() as net, connect_rtc(net.signal, voice=False) as client:
        session = next(iter(net.gateway.sessions.values()))
        net.gateway.close_all("bridge shutting down")
        await wait_for_no_sessions(net.gateway)
        assert session.end_reason == "bridge shutting down"
        with pytest.raises(ClientClosed), trio.fail_after(10):
            while True:
                await client.receive_text()


async def test_a_client_that_never_connects_is_dropped_after_the_deadline() -> None:
    async with network(settings=SessionSettings(connect_timeout=0.5)) as net:
        # a real offer whose sender then vanishes before ICE
        from aiortc import RTCConfiguration, RTCPeerConnection

        from companion.rtc import host_addresses

        island = net.gateway.island
        island.enter()
        pc = await island.call(_make_pc, RTCConfiguration(iceServers=[]), RTCPeerConnection)
        pc.createDataChannel("firehose")
        with host_addresses(("127.0.0.1",)):
            await island.call(pc.setLocalDescription, await island.call(pc.createOffer))
        await island.call(pc.close)
        reply = await net.gateway.offer(json.dumps({"type": "offer", "sdp": pc.localDescription.sdp}))
        assert reply.status == 200
        session = net.gateway.sessions[reply.session_id]  # type: ignore[index]
        with trio.fail_after(5):
            await net.gateway.wait_for_sessions(0)
        assert session.end_reason is not None and "did not open within 0.5 s" in session.end_reason


async def _make_pc(config: C, cls: Callable[[C], T]) -> T:
    return cls(config)


async def test_a_silent_peer_is_dropped_when_consent_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    # RFC 7675 consent checks every 5 s and gives up after 6 failures; shorten both for the test
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.2)
    monkeypatch.setattr(aioice.ice, "CONSENT_FAILURES", 3)
    async with network() as net, connect_rtc(net.signal, voice=False) as client:
        session = next(iter(net.gateway.sessions.values()))
        # the client's machine goes silent (as if frozen or unplugged): its ICE sockets neither
        # send nor receive from now on, and nothing says goodbye
        pc = client._pc
        assert pc is not None and pc.sctp is not None
        ice = pc.sctp.transport.transport._connection
        for protocol in ice._protocols:
            monkeypatch.setattr(protocol.transport, "sendto", lambda *args, **kwargs: None)
            monkeypatch.setattr(protocol, "datagram_received", lambda data, addr: None)
        # with consent checks at their default pace (every 5 s, 6 failures) this takes 30 s;
        # shortened, the bridge notices within about a second, after several missed checks
        silent_since = trio.current_time()
        with trio.fail_after(5):
            await net.gateway.wait_for_sessions(0)
        assert trio.current_time() - silent_since >= 2 * 0.8 * 0.2
        assert session.end_reason is not None and "went silent" in session.end_reason
