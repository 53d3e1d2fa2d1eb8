"""``companion listen --webrtc``: the terminal client over a data channel, with the bridge's voice.

The terminal client is written against two WebSocket calls (``send_message``/``get_message``,
``ConnectionClosed`` at the end); :class:`RtcFrames` offers exactly those over an
:class:`~companion.rtc.client.RtcClient`, so the client itself does not change. With voice,
the bridge speaks the lines and answers the speak queries; the track's audio is piped to an
audio player process (raw 16-bit mono PCM on stdin), as a headless speaker or robot would.
"""

from __future__ import annotations

import array
import logging
import subprocess
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

import trio
from trio_websocket import CloseReason, ConnectionClosed

from companion.log import log_event
from companion.rtc.client import ClientClosed, ReceivedAudio, RtcClient, connect_rtc
from companion.rtc.voicequeue import SAMPLE_RATE

__all__ = ["MessageConnection", "RtcFrames", "open_rtc_listener", "play_audio"]

logger = logging.getLogger("companion.rtc.listen")

CLOSE_GOING_AWAY = 1001


class MessageConnection(Protocol):
    """The part of a trio-websocket connection the terminal client uses."""

    async def send_message(self, message: str) -> None: ...

    async def get_message(self) -> str | bytes: ...


class RtcFrames:
    """:class:`MessageConnection` over a WebRTC data channel."""

    def __init__(self, client: RtcClient) -> None:
        self.client = client

    async def send_message(self, message: str) -> None:
        try:
            await self.client.send_text(message)
        except ClientClosed as exc:
            raise ConnectionClosed(CloseReason(CLOSE_GOING_AWAY, exc.reason)) from None

    async def get_message(self) -> str:
        try:
            return await self.client.receive_text()
        except ClientClosed as exc:
            raise ConnectionClosed(CloseReason(CLOSE_GOING_AWAY, exc.reason)) from None


def _mono(audio: ReceivedAudio) -> bytes:
    """The first channel (the voice is mono; WebRTC decodes it as two equal channels)."""
    if audio.channels == 1:
        return audio.pcm
    samples = array.array("h", audio.pcm)
    return samples[0 :: audio.channels].tobytes()


async def play_audio(audio: trio.MemoryReceiveChannel[ReceivedAudio], player: Sequence[str]) -> None:
    """Pipe every received frame to ``player`` (an argv template with ``{rate}``) until
    cancelled. If the player cannot start or exits, the audio is discarded (and logged)."""
    argv = [part.replace("{rate}", str(SAMPLE_RATE)) for part in player]
    try:
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except OSError as exc:
        log_event(logger, "player_unavailable", logging.WARNING, player=argv[0], error=str(exc))
        async for _ in audio:
            pass
        return
    assert process.stdin is not None
    try:
        async for frame in audio:
            if frame.sample_rate != SAMPLE_RATE:
                continue  # a non-Opus codec: the player was started for 48 kHz
            try:
                await process.stdin.send_all(_mono(frame))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                log_event(logger, "player_exited", logging.WARNING, player=argv[0], code=process.poll())
                async for _ in audio:
                    pass
                return
    finally:
        with trio.CancelScope(shield=True):
            process.terminate()
            with trio.move_on_after(2):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


@asynccontextmanager
async def open_rtc_listener(
    url: str,
    *,
    token: str | None,
    voice: bool,
    player: Sequence[str] | None,
    topics: Iterable[str] | None = None,
) -> AsyncIterator[RtcFrames]:
    """Connect to the bridge at ``url`` over WebRTC; with ``voice``, play its audio track
    through ``player`` (or discard it when there is none). ``topics``: as for a WebSocket."""
    async with (
        connect_rtc(url, token=token, voice=voice, topics=topics) as client,
        trio.open_nursery() as nursery,
    ):
        if voice:
            if player:
                nursery.start_soon(play_audio, client.audio, player)
            else:
                nursery.start_soon(_discard, client.audio)
        try:
            yield RtcFrames(client)
        finally:
            nursery.cancel_scope.cancel()


async def _discard(audio: trio.MemoryReceiveChannel[ReceivedAudio]) -> None:
    async for _ in audio:
        pass
