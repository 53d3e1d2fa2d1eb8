"""A WebRTC client of the bridge with aiortc: what ``companion listen --webrtc`` (a robot, a
headless speaker) and the tests use.

It posts an offer to ``/webrtc/offer``, then exchanges exactly the Firehose frames of the
WebSocket over a data channel, and, with ``voice=True``, receives the companions' speech as
decoded audio frames. Everything happens inside :func:`connect_rtc`; leaving the block (or
being cancelled) closes the peer connection within a deadline.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import av
import trio
from aiortc import (
    MediaStreamTrack,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from companion.bridge import httpclient
from companion.log import log_event
from companion.rtc.http import MAX_REPLY_BYTES, offer_url
from companion.rtc.ice import host_addresses
from companion.rtc.island import AsyncioIsland, open_island, single_exceptions
from companion.rtc.peer import PeerSettings, close_peer, new_peer_connection

__all__ = [
    "ClientClosed",
    "ClientSettings",
    "OfferRejected",
    "ReceivedAudio",
    "RtcClient",
    "Signaler",
    "connect_rtc",
]

logger = logging.getLogger("companion.rtc")


Signaler = Callable[[bytes], Awaitable[tuple[int, bytes | str]]]
"""``offer body -> (HTTP status, answer body)``: how the offer reaches the bridge."""


class ClientClosed(Exception):
    """The session ended; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class OfferRejected(Exception):
    """The bridge refused the offer (HTTP status and its error body)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code


@dataclass(frozen=True, slots=True)
class ClientSettings(PeerSettings):
    """Limits and deadlines of a client (beside those of :class:`PeerSettings`)."""

    http_timeout: float = 10.0
    """Offer posted to answer read."""
    inbound_frames: int = 4096
    audio_frames: int = 500
    """Decoded frames kept for a slow consumer (10 s); newer ones are dropped and counted."""
    audio_codec: str | None = None
    """Offer only this audio codec (e.g. ``"PCMU"``); default: aiortc's list, Opus first."""


@dataclass(frozen=True, slots=True)
class ReceivedAudio:
    """One decoded audio frame: interleaved s16 samples."""

    pcm: bytes
    sample_rate: int
    channels: int
    samples: int
    received_at: float
    """``time.monotonic()`` when it was decoded."""

    @property
    def peak(self) -> int:
        """Largest absolute sample (0 for silence)."""
        view = memoryview(self.pcm).cast("h")
        return max((abs(v) for v in view), default=0)


class RtcClient:
    """The connected client; use inside :func:`connect_rtc`."""

    def __init__(self, island: AsyncioIsland, settings: ClientSettings) -> None:
        self.island = island
        self.settings = settings
        self.session_id: str | None = None
        self.voice = False
        self.audio_dropped = 0
        self.close_reason: str | None = None
        self._pc: RTCPeerConnection | None = None
        self._channel: RTCDataChannel | None = None
        self._open = trio.Event()
        self._ended = trio.Event()
        self._track_ready = trio.Event()
        self._remote_track: MediaStreamTrack | None = None
        self._frames_send, self._frames_recv = trio.open_memory_channel[str](settings.inbound_frames)
        self._audio_send, self.audio = trio.open_memory_channel[ReceivedAudio](settings.audio_frames)

    # --- public --------------------------------------------------------------------------

    async def send_text(self, text: str) -> None:
        """Send one Firehose frame (``{"topic", "body"}``) or control frame."""
        if self.close_reason is not None or self._channel is None:
            raise ClientClosed(self.close_reason or "not connected")
        try:
            self._channel.send(text)
        except Exception as exc:  # aiortc raises InvalidStateError once the channel closed
            raise ClientClosed(f"data channel closed ({type(exc).__name__})") from exc
        await trio.lowlevel.checkpoint()

    async def send_json(self, obj: Any) -> None:
        await self.send_text(json.dumps(obj, ensure_ascii=False))

    async def receive_text(self) -> str:
        """The next frame from the bridge; raises :class:`ClientClosed` once the session ended
        and every frame received before has been read."""
        try:
            return await self._frames_recv.receive()
        except trio.EndOfChannel:
            raise ClientClosed(self.close_reason or "closed") from None

    async def stop_speech(self) -> None:
        """Ask the bridge to stop the line playing and drop the queued ones."""
        await self.send_json({"control": "stop"})

    async def set_voice(self, enabled: bool) -> None:
        await self.send_json({"control": "voice", "enabled": enabled})

    @property
    def connection_state(self) -> str:
        return "closed" if self._pc is None else str(self._pc.connectionState)

    # --- connecting ----------------------------------------------------------------------

    async def _connect(
        self,
        url: str | Signaler,
        *,
        token: str | None,
        voice: bool,
        audio: bool,
        topics: Iterable[str] | None,
    ) -> None:
        self.island.enter()
        pc = await self.island.call(new_peer_connection)
        self._pc = pc
        pc.on("connectionstatechange", self._on_connection_state)
        pc.on("track", self._on_track)
        channel = pc.createDataChannel("firehose")
        self._channel = channel
        channel.on("open", self._open.set)
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._end("data channel closed by the bridge"))
        if audio:
            transceiver = pc.addTransceiver("audio", direction="recvonly")
            if self.settings.audio_codec is not None:
                wanted = f"audio/{self.settings.audio_codec}".lower()
                capabilities = RTCRtpReceiver.getCapabilities("audio")
                codecs = capabilities.codecs if capabilities is not None else []
                transceiver.setCodecPreferences([c for c in codecs if c.mimeType.lower() == wanted])
        with host_addresses(self.settings.ice_addresses):
            await self.island.call(pc.setLocalDescription, await self.island.call(pc.createOffer))
        request: dict[str, Any] = {"type": "offer", "sdp": pc.localDescription.sdp, "voice": voice}
        if topics is not None:
            request["topics"] = sorted(topics)
        body = json.dumps(request).encode("utf-8")
        text: bytes | str
        with trio.fail_after(self.settings.http_timeout):
            if isinstance(url, str):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                reply = await httpclient.request(
                    "POST",
                    offer_url(url),
                    body=body,
                    headers=headers,
                    timeout=self.settings.http_timeout,
                    limit=MAX_REPLY_BYTES,
                )
                status, text = reply.status, reply.body
            else:
                status, text = await url(body)
        answer = _parse_answer(status, text)
        self.session_id = answer.get("session")
        self.voice = bool(answer.get("voice"))
        await self.island.call(pc.setRemoteDescription, RTCSessionDescription(answer["sdp"], "answer"))
        with trio.fail_after(self.settings.connect_timeout):
            await self._open.wait()
        log_event(logger, "rtc_client_connected", session=self.session_id, voice=self.voice)

    # --- aiortc callbacks ----------------------------------------------------------------

    def _on_message(self, data: str | bytes) -> None:
        text = data if isinstance(data, str) else data.decode("utf-8", "replace")
        try:
            self._frames_send.send_nowait(text)
        except trio.WouldBlock:
            self._end(f"more than {self.settings.inbound_frames} frames unread")
        except trio.ClosedResourceError:
            pass

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self._remote_track is None:
            self._remote_track = track
            self._track_ready.set()

    def _on_connection_state(self) -> None:
        if self._pc is not None and self._pc.connectionState in ("failed", "closed"):
            self._end(f"connection {self._pc.connectionState}")

    def _end(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
            log_event(logger, "rtc_client_ending", session=self.session_id, reason=reason)
        self._frames_send.close()
        self._ended.set()

    # --- tasks ---------------------------------------------------------------------------

    async def _pump_audio(self) -> None:
        await self._track_ready.wait()
        track = self._remote_track
        assert track is not None
        while True:
            try:
                frame = await self.island.call(track.recv)
            except MediaStreamError:
                return
            if not isinstance(frame, av.AudioFrame):
                continue
            channels = len(frame.layout.channels)
            audio = ReceivedAudio(
                pcm=bytes(frame.planes[0])[: frame.samples * channels * 2],
                sample_rate=frame.sample_rate,
                channels=channels,
                samples=frame.samples,
                received_at=time.monotonic(),
            )
            try:
                self._audio_send.send_nowait(audio)
            except trio.WouldBlock:
                self.audio_dropped += 1

    async def _close(self) -> None:
        self._end(self.close_reason or "closed by the client")
        self._audio_send.close()
        pc, self._pc = self._pc, None
        if not await close_peer(self.island, pc, self.settings):
            log_event(logger, "rtc_client_close_timeout", logging.WARNING, session=self.session_id)


def _parse_answer(status: int, body: bytes | str) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if status != 200 or not isinstance(obj, dict) or not isinstance(obj.get("sdp"), str):
        error = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(error, dict):
            raise OfferRejected(status, str(error.get("code")), str(error.get("message")))
        text = body if isinstance(body, str) else body.decode("utf-8", "replace")
        raise OfferRejected(status, "bad_reply", text[:200])
    return obj


@asynccontextmanager
async def connect_rtc(
    url: str | Signaler,
    *,
    token: str | None = None,
    voice: bool = True,
    audio: bool | None = None,
    topics: Iterable[str] | None = None,
    settings: ClientSettings | None = None,
) -> AsyncIterator[RtcClient]:
    """Connect to the bridge at ``url`` (``http://host:port`` or its ``ws://`` URL), or through
    a :data:`Signaler` that delivers the offer some other way (in-process, tests).

    ``voice``: the bridge speaks ``speak`` queries on an audio track from the start;
    ``audio`` (default: ``voice``): offer to receive audio at all, so voice can be switched on
    later with :meth:`RtcClient.set_voice`.

    Raises :class:`OfferRejected` when the bridge refuses, ``trio.TooSlowError`` when it does
    not answer or the data channel does not open in time, ``OSError`` when unreachable.
    """
    with single_exceptions():
        async with open_island() as island:
            client = RtcClient(island, settings or ClientSettings())
            try:
                await client._connect(
                    url, token=token, voice=voice, audio=voice if audio is None else audio, topics=topics
                )
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(client._pump_audio)
                    try:
                        yield client
                    finally:
                        nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    await client._close()
