"""One WebRTC client on the bridge: SDP answer, the Firehose data channel, and the voice track.

The session is a trio object around an aiortc peer connection (the asyncio island). The
bridge serves it like a WebSocket client through :class:`DataChannelFrames`:

- frames from the bridge's queue for this client go out on the data channel (``speak``
  queries are also handed to the voice when it is on);
- frames from the data channel go to the bridge, except control frames (:mod:`.control`);
- the voice synthesizes speak queries in order and queues them on the track; when a line's
  audio has been sent, the query's result is published, so turns follow real speech.

The session ends when the peer closes, ICE fails or consent expires, the data channel does not
open in time, the client cannot keep up, or the caller is cancelled. Teardown always runs
(shielded, with a deadline): unanswered speak queries get an "interrupted" result, the track
stops and the peer connection closes, so no asyncio task, track or socket outlives it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import trio
from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import InternalError, InvalidAccessError

from companion.bridge.channel import ChannelClosed
from companion.log import log_event
from companion.memory import Publisher
from companion.protocol import (
    QUERIES,
    SPEAK_QUERY,
    Query,
    QueryResult,
    QueryResultBody,
    new_id,
    parse_payload,
)
from companion.rtc.audio import to_track_rate
from companion.rtc.control import ControlError, StopSpeech, VoiceSwitch, interpret_control, is_new_message
from companion.rtc.ice import host_addresses
from companion.rtc.island import AsyncioIsland
from companion.rtc.opus import OpusLineEncoder, opus_silence
from companion.rtc.peer import PeerSettings, close_peer, new_peer_connection
from companion.rtc.seam import FrameServer
from companion.rtc.signaling import OfferRequest, audio_codec
from companion.rtc.track import VoiceTrack
from companion.rtc.voicequeue import SAMPLE_RATE, VoiceQueue, pcm_frames
from companion.voice import SynthesisError, Synthesizer

__all__ = ["DataChannelFrames", "NegotiationFailed", "RtcSession", "SessionSettings", "SessionStats"]

logger = logging.getLogger("companion.rtc")

GONE: Final = "the client left or went silent (consent expired)"
"""aiortc closes the same way for both: when consent expires, the transports below close."""

HEAD_FRAMES: Final = 8
"""Frames of a line encoded at once so it starts playing; the rest follows from a thread."""

_SDP_ERRORS: Final = (ValueError, AssertionError, KeyError, IndexError, InternalError, InvalidAccessError)


class NegotiationFailed(ValueError):
    """The client's offer cannot be answered (malformed or unsupported SDP)."""


@dataclass(frozen=True, slots=True)
class SessionSettings(PeerSettings):
    """Limits and deadlines of one session, beside those of :class:`PeerSettings` (the defaults
    suit a bridge on a LAN)."""

    negotiate_timeout: float = 10.0
    """Offer in, answer out (candidate gathering included)."""
    inbound_frames: int = 256
    """Client frames waiting for the bridge; a client that floods past this is disconnected."""
    send_high_water: int = 1024 * 1024
    """Bytes buffered on the data channel before the session waits for the client."""
    send_stall_timeout: float = 10.0
    """How long the buffer may stay above the high water mark before the client is dropped."""
    publish_timeout: float = 5.0
    voice_lines: int = 32
    """Speak queries waiting (synthesizing or queued) before new ones are refused."""


@dataclass
class SessionStats:
    """What a session did (for logs, tests and the benchmark)."""

    frames_in: int = 0
    frames_out: int = 0
    lines_spoken: int = 0
    lines_interrupted: int = 0
    lines_failed: int = 0
    speak_latencies: list[float] = field(default_factory=list)
    """Seconds from a speak query reaching the session to its first audio frame."""


@dataclass
class _Pending:
    query_id: str
    text: str
    emotion: str | None
    received: float
    generation: int
    seconds: float = 0.0
    audible: bool = False


class RtcSession:
    """Server side of one WebRTC client. Create, :meth:`negotiate`, then :meth:`run`."""

    def __init__(
        self,
        island: AsyncioIsland,
        request: OfferRequest,
        *,
        synthesizer: Synthesizer | None = None,
        settings: SessionSettings | None = None,
        session_id: str | None = None,
    ) -> None:
        self.id = session_id or new_id()
        self.island = island
        self.request = request
        self.settings = settings or SessionSettings()
        self.synthesizer = synthesizer
        self.stats = SessionStats()
        self.end_reason: str | None = None
        self.voice_negotiated = False
        """A voice track was negotiated (the offer could receive audio, the bridge can speak)."""
        self._voice_on = False
        self._pc: RTCPeerConnection | None = None
        self._channel: RTCDataChannel | None = None
        self._track: VoiceTrack | None = None
        self._queue = VoiceQueue(max_lines=self.settings.voice_lines)
        self._pending: dict[str, _Pending] = {}
        self._generation = 0
        self._synth_scope: trio.CancelScope | None = None
        self._ended = trio.Event()
        self._channel_open = trio.Event()
        self._served = trio.Event()
        self._serving = False
        self.frames = DataChannelFrames(self)
        self._buffer_low = trio.Event()
        self._inbound_send, self._inbound_recv = trio.open_memory_channel[str | bytes](
            self.settings.inbound_frames
        )
        self._jobs_send, self._jobs_recv = trio.open_memory_channel[_Pending](self.settings.voice_lines)
        self._results_send, self._results_recv = trio.open_memory_channel[QueryResult](math.inf)
        self._closed = False

    # --- negotiation -------------------------------------------------------------------

    async def negotiate(self) -> str:
        """Apply the client's offer and return the answer SDP (ICE candidates included).

        On failure the peer connection is closed and the exception propagates: an offer that
        cannot be used raises :class:`NegotiationFailed`, a deadline ``trio.TooSlowError``.
        """
        self.island.enter()
        try:
            with trio.fail_after(self.settings.negotiate_timeout):
                return await self._negotiate()
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._close_peer()
            raise

    async def _negotiate(self) -> str:
        pc = await self.island.call(new_peer_connection)
        self._pc = pc
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)
        try:
            await self.island.call(pc.setRemoteDescription, RTCSessionDescription(self.request.sdp, "offer"))
        except _SDP_ERRORS as exc:  # aiortc's parser asserts; all of these mean "bad offer"
            raise NegotiationFailed(f"unusable offer SDP ({type(exc).__name__}: {exc})") from exc
        if self.synthesizer is not None and any(t.kind == "audio" for t in pc.getTransceivers()):
            # the track is there whenever the client can receive audio, so voice can be
            # switched on later without renegotiating; ``voice`` says whether it starts on
            self._track = VoiceTrack(self._queue, self._lines_finished, on_frame=self._frame_played)
            pc.addTrack(self._track)
            self.voice_negotiated = True
            self._voice_on = self.request.voice
        answer = await self.island.call(pc.createAnswer)
        with host_addresses(self.settings.ice_addresses):
            await self.island.call(pc.setLocalDescription, answer)
        local = pc.localDescription
        if self._track is not None and audio_codec(local.sdp) == "opus":
            # encode each line once ahead of time; aiortc only packetizes (see .opus)
            self._track.encoded = True
            self._queue.silence = opus_silence()
        log_event(
            logger,
            "rtc_answered",
            session=self.id,
            voice=self._voice_on,
            candidates=local.sdp.count("a=candidate:"),
        )
        return str(local.sdp)

    # --- aiortc callbacks (asyncio side, same thread: non-blocking hand-offs only) ---------

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if self._channel is not None:
            log_event(
                logger, "rtc_extra_channel_closed", logging.WARNING, session=self.id, label=channel.label
            )
            channel.close()
            return
        self._channel = channel
        channel.bufferedAmountLowThreshold = self.settings.send_high_water // 2
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._end(f"data channel closed: {GONE}"))
        channel.on("bufferedamountlow", self._buffer_low.set)
        if channel.readyState == "open":
            self._channel_open.set()
        else:
            channel.on("open", self._channel_open.set)

    def _on_message(self, data: str | bytes) -> None:
        try:
            self._inbound_send.send_nowait(data)
        except trio.WouldBlock:
            limit = self.settings.inbound_frames
            self._end(f"client sent more than {limit} frames faster than they could be handled")
        except trio.ClosedResourceError:
            pass

    def _on_connection_state(self) -> None:
        if self._pc is None:
            return
        state = self._pc.connectionState
        if state == "failed":
            self._end("connection failed (ICE)")
        elif state == "closed":
            self._end(f"peer connection closed: {GONE}")

    def _lines_finished(self, keys: Sequence[str]) -> None:
        for key in keys:
            pending = self._pending.get(key)
            if pending is None:
                continue
            self.stats.lines_spoken += 1
            body: dict[str, Any] = {"spoken": True, "seconds": round(pending.seconds, 3)}
            if self.synthesizer is not None:
                body["voice"] = self.synthesizer.name
            self._answer(key, QueryResult(id=key, result=QueryResultBody(success=True, body=body)))

    def _frame_played(self, key: str | None) -> None:
        if key is None:
            return
        pending = self._pending.get(key)
        if pending is not None and not pending.audible:
            pending.audible = True
            self.stats.speak_latencies.append(time.monotonic() - pending.received)

    # --- running -----------------------------------------------------------------------

    async def run(self, server: FrameServer, publisher: Publisher) -> str:
        """Serve the client through ``server`` (the bridge) until the session ends; speak
        results are published with ``publisher``. Returns why it ended, after tearing the
        peer connection down (also when cancelled)."""
        self.island.enter()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_connect)
                nursery.start_soon(self._report, publisher)
                nursery.start_soon(self._serve, server)
                if self.voice_negotiated:
                    nursery.start_soon(self._synthesize_in_order)
                await self._ended.wait()
                # The bridge's reader now sees the client close and ends its side normally.
                self._inbound_send.close()
                if self._serving:
                    with trio.move_on_after(self.settings.close_timeout):
                        await self._served.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if self.end_reason is None:
                    self.end_reason = "cancelled"
                await self._teardown(publisher)
        return self.end_reason

    async def abort(self) -> None:
        """Close the peer connection without running (the bridge could not take the client);
        harmless after :meth:`run`."""
        if self.end_reason is None:
            self.end_reason = "aborted"
        self._ended.set()
        await self._close_peer()

    def close(self, reason: str = "closed by the bridge") -> None:
        """Ask a running session to end (idempotent)."""
        self._end(reason)

    def _end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
            log_event(logger, "rtc_session_ending", session=self.id, reason=reason)
        self._ended.set()

    async def _watch_connect(self) -> None:
        with trio.move_on_after(self.settings.connect_timeout):
            await self._channel_open.wait()
            log_event(logger, "rtc_connected", session=self.id)
            return
        self._end(f"the data channel did not open within {self.settings.connect_timeout} s")

    async def _serve(self, server: FrameServer) -> None:
        await self._channel_open.wait()
        self._serving = True
        try:
            await server.serve_channel(self.frames, topics=self.request.topics, label=f"webrtc:{self.id[:8]}")
        finally:
            self._served.set()
        self._end("the bridge closed the client")

    # --- the bridge's frame channel --------------------------------------------------------

    async def send_frame(self, text: str) -> None:
        """A frame for the client (the bridge's writer calls this, in order)."""
        if self._ended.is_set():
            raise ChannelClosed(self.end_reason or "closed")
        if self._voice_on:
            self._maybe_speak(text)
        await self._send(text)

    async def receive_frame(self) -> str | bytes | None:
        """The next Firehose frame from the client; ``None`` once the session is ending.
        Control frames are handled here and never reach the bridge."""
        while True:
            try:
                data = await self._inbound_recv.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return None
            self.stats.frames_in += 1
            obj = _peek_json(data)
            control = interpret_control(obj)
            if isinstance(control, StopSpeech):
                self._flush("stop")
            elif isinstance(control, VoiceSwitch):
                self._switch_voice(control.enabled)
                with contextlib.suppress(ChannelClosed):  # tell the client the outcome
                    await self._send(json.dumps({"control": "voice", "enabled": self._voice_on}))
            elif isinstance(control, ControlError):
                with contextlib.suppress(ChannelClosed):
                    await self._send(_control_error(control))
            else:
                if is_new_message(obj):
                    self._flush("new message")
                return data

    async def _send(self, text: str) -> None:
        channel = self._channel
        if channel is None or self._ended.is_set():
            raise ChannelClosed(self.end_reason or "not connected")
        if channel.bufferedAmount > self.settings.send_high_water:
            self._buffer_low = trio.Event()
            with trio.move_on_after(self.settings.send_stall_timeout) as stall:
                while channel.bufferedAmount > self.settings.send_high_water // 2:
                    await self._buffer_low.wait()
                    self._buffer_low = trio.Event()
            if stall.cancelled_caught:
                unsent, waited = channel.bufferedAmount, self.settings.send_stall_timeout
                self._end(f"client too slow: {unsent} bytes unsent for {waited} s")
                raise ChannelClosed(self.end_reason or "too slow")
        try:
            channel.send(text)
        except Exception as exc:  # aiortc raises InvalidStateError once the channel closes
            self._end(f"data channel send failed: {type(exc).__name__}")
            raise ChannelClosed(self.end_reason or "closed") from exc
        self.stats.frames_out += 1

    # --- voice ---------------------------------------------------------------------------

    @property
    def voice_on(self) -> bool:
        """Whether speak queries are answered with audio now."""
        return self._voice_on

    def _switch_voice(self, enabled: bool) -> None:
        if enabled and not self.voice_negotiated:
            log_event(logger, "rtc_voice_unavailable", logging.WARNING, session=self.id)
            return
        if enabled and self.synthesizer is None:
            return
        if not enabled:
            self._flush("voice off")
        self._voice_on = enabled
        log_event(logger, "rtc_voice", session=self.id, enabled=enabled)

    def _maybe_speak(self, text: str) -> None:
        if '"speak"' not in text or '"query.send"' not in text:
            return  # cheap pre-check: most frames are not speak queries
        parsed = parse_payload(QUERIES, text.encode("utf-8", "surrogatepass"))
        if not isinstance(parsed, Query) or parsed.params.type != SPEAK_QUERY or parsed.id in self._pending:
            return
        body = parsed.params.body or {}
        line = body.get("message")
        emotion = body.get("emotion")
        if not isinstance(line, str):
            self._answer(parsed.id, _failed(parsed.id, "speak query without a message"))
            return
        pending = _Pending(
            query_id=parsed.id,
            text=line,
            emotion=emotion if isinstance(emotion, str) else None,
            received=time.monotonic(),
            generation=self._generation,
        )
        try:
            self._jobs_send.send_nowait(pending)
        except trio.WouldBlock:
            self.stats.lines_failed += 1
            self._answer(parsed.id, _failed(parsed.id, "voice queue is full"))
            return
        self._pending[parsed.id] = pending

    async def _synthesize_in_order(self) -> None:
        assert self.synthesizer is not None
        async for job in self._jobs_recv:
            if job.generation != self._generation or job.query_id not in self._pending:
                continue  # flushed while waiting; already answered
            with trio.CancelScope() as scope:
                self._synth_scope = scope
                try:
                    speech = await self.synthesizer.synthesize(job.text, emotion=job.emotion)
                except SynthesisError as exc:
                    self.stats.lines_failed += 1
                    log_event(
                        logger, "rtc_speech_failed", logging.WARNING, session=self.id, reason=exc.reason
                    )
                    self._answer(job.query_id, _failed(job.query_id, f"voice synthesis failed: {exc}"))
                    continue
                finally:
                    self._synth_scope = None
            if scope.cancelled_caught or job.generation != self._generation:
                continue
            pcm = to_track_rate(speech)
            job.seconds = len(pcm) / (2 * SAMPLE_RATE)
            frames = pcm_frames(pcm)
            encoder = OpusLineEncoder() if self._track is not None and self._track.encoded else None
            head = frames if encoder is None else encoder.encode(frames[:HEAD_FRAMES])
            full = self._queue.add(job.query_id, head, complete=encoder is None)
            if full is not None:
                self.stats.lines_failed += 1
                self._answer(job.query_id, _failed(job.query_id, f"voice queue is full: {full.reason}"))
                continue
            if encoder is not None:
                # the line is already playing; the rest is encoded off the event loop
                tail = await trio.to_thread.run_sync(encoder.encode_rest, frames[HEAD_FRAMES:])
                self._queue.extend(job.query_id, tail)  # False if flushed meanwhile: answered

    def _flush(self, reason: str) -> None:
        """Drop what is queued or being synthesized; answer those queries as interrupted."""
        self._generation += 1
        if self._synth_scope is not None:
            self._synth_scope.cancel()
        self._queue.flush()
        finishing = set(self._queue.take_finished())
        if finishing:
            self._lines_finished(sorted(finishing))
        dropped = list(self._pending)
        for key in dropped:
            self.stats.lines_interrupted += 1
            self._answer(
                key,
                QueryResult(
                    id=key,
                    result=QueryResultBody(success=False, body={"interrupted": True, "reason": reason}),
                ),
            )
        if dropped:
            log_event(logger, "rtc_voice_flushed", session=self.id, reason=reason, lines=len(dropped))

    def _answer(self, key: str, result: QueryResult) -> None:
        """Settle a speak query exactly once."""
        self._pending.pop(key, None)
        try:
            self._results_send.send_nowait(result)
        except trio.ClosedResourceError:
            log_event(logger, "rtc_result_dropped", logging.WARNING, session=self.id, query=key)

    async def _report(self, publisher: Publisher) -> None:
        async for result in self._results_recv:
            await self._publish(publisher, result)

    async def _publish(self, publisher: Publisher, result: QueryResult) -> None:
        try:
            with trio.move_on_after(self.settings.publish_timeout) as scope:
                await publisher.publish(QUERIES, result)
        except Exception as exc:  # the network is going away (shutdown); the companion times out
            log_event(
                logger,
                "rtc_result_publish_failed",
                logging.WARNING,
                session=self.id,
                query=result.id,
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        if scope.cancelled_caught:
            log_event(logger, "rtc_result_publish_timeout", logging.WARNING, session=self.id, query=result.id)

    # --- teardown ----------------------------------------------------------------------

    async def _teardown(self, publisher: Publisher) -> None:
        if self._closed:
            return
        self._closed = True
        reason = self.end_reason or "closed"
        self._flush(f"session closed: {reason}")
        self._results_send.close()
        self._inbound_send.close()
        self._jobs_send.close()
        with trio.move_on_after(self.settings.publish_timeout):
            async for result in self._results_recv:
                await self._publish(publisher, result)
        await self._close_peer()
        log_event(
            logger,
            "rtc_session_closed",
            session=self.id,
            reason=reason,
            frames_in=self.stats.frames_in,
            frames_out=self.stats.frames_out,
            lines_spoken=self.stats.lines_spoken,
            lines_interrupted=self.stats.lines_interrupted,
        )

    async def _close_peer(self) -> None:
        if self._track is not None:
            self._track.stop()
        pc, self._pc = self._pc, None
        if not await close_peer(self.island, pc, self.settings):
            log_event(logger, "rtc_close_timeout", logging.WARNING, session=self.id)


class DataChannelFrames:
    """The session's data channel as the bridge's :class:`FrameChannel`."""

    def __init__(self, session: RtcSession) -> None:
        self._session = session

    async def send(self, text: str) -> None:
        await self._session.send_frame(text)

    async def receive(self) -> str | bytes | None:
        return await self._session.receive_frame()

    async def close(self, code: int, reason: str) -> None:
        self._session.close(f"closed by the bridge ({code}: {reason})")
        await trio.lowlevel.checkpoint()


def _failed(query_id: str, message: str) -> QueryResult:
    """The line could not be spoken (an infrastructure failure, reported as aikyo's ``error``)."""
    return QueryResult(id=query_id, error=message)


def _interrupted(query_id: str, reason: str) -> QueryResult:
    """The line was dropped before it was completely heard (stop, new message, closed)."""
    body = {"interrupted": True, "reason": reason}
    return QueryResult(id=query_id, result=QueryResultBody(success=False, body=body))


def _peek_json(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None  # not JSON: the bridge answers it with its own error frame


def _control_error(error: ControlError) -> str:
    return json.dumps(
        {"error": {"name": "FrameError", "code": "invalid_control", "message": error.message, "issues": []}}
    )
