"""Shared by the client tests: the espeak-ng skip marker, a screen that records what a
terminal client shows, and the audio a WebRTC client has received."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import trio

from companion.listen import Show
from companion.rtc import ReceivedAudio, RtcClient
from companion.voice import EspeakSynthesizer

needs_espeak = pytest.mark.skipif(
    not EspeakSynthesizer.available(),
    reason="espeak-ng is not installed (scripts/system-deps.sh installs it)",
)


@dataclass
class Screen:
    """Collects what the client shows; tests wait on it for a line."""

    lines: list[Show] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    def __call__(self, show: Show) -> None:
        self.lines.append(show)
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, text: str, timeout: float = 5) -> Show:
        with trio.fail_after(timeout):
            while True:
                for line in self.lines:
                    if text in line.text:
                        return line
                await self.changed.wait()


def drain_audio(client: RtcClient) -> list[ReceivedAudio]:
    """The audio frames ``client`` has received and not yet taken, without waiting."""
    frames = []
    while True:
        try:
            frames.append(client.audio.receive_nowait())
        except trio.WouldBlock:
            return frames
