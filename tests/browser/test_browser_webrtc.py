"""The web page over WebRTC in headless Chromium: data channel for the frames, voice as an RTP track.

The bridge runs in this process on an in-memory network with its WebRTC gateway (espeak-ng as
the voice) and offers only 127.0.0.1 as an ICE candidate. Chromium is told to use loopback for
WebRTC (it normally will not) and to show its real addresses instead of mDNS names.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import trio

from browser.browser_cdp import SPEECH_STUB, Page, chromium
from companion.memory import MemoryEndpoint
from companion.protocol import MESSAGES, QUERIES, Message, Query, QueryResult
from companion.rtc.route import serve_webrtc
from companion.voice import EspeakSynthesizer
from support.bridges import bridge_on_hub
from support.cards import metadata as md

pytestmark = pytest.mark.skipif(
    not EspeakSynthesizer.available(),
    reason="espeak-ng is not installed (scripts/system-deps.sh installs it)",
)

JUNIPER = md("juniper", name="Juniper", personality="calm")

WEBRTC_FLAGS = (
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
    "--autoplay-policy=no-user-gesture-required",
)

INBOUND_AUDIO = """
(async () => {
  const pc = window.companionLink.peerConnection();
  if (!pc) return null;
  const stats = await pc.getStats();
  for (const report of stats.values()) {
    if (report.type === "inbound-rtp" && report.kind === "audio") {
      return { packets: report.packetsReceived || 0, energy: report.totalAudioEnergy || 0,
               samples: report.totalSamplesReceived || 0 };
    }
  }
  return { packets: 0, energy: 0, samples: 0 };
})()
"""


def chromium_with_webrtc(executable: str, directory: Path) -> str:
    """A wrapper that starts the system Chromium with the WebRTC flags this test needs."""
    wrapper = directory / "chromium-webrtc"
    flags = " ".join(WEBRTC_FLAGS)
    wrapper.write_text(f'#!/bin/sh\nexec "{executable}" {flags} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


async def from_page(companion: MemoryEndpoint, kind: type, timeout: float = 15) -> object:
    with trio.fail_after(timeout):
        while True:
            item = await companion.receive_channel.receive()
            if item.sender_peer == "bridge" and isinstance(item.payload, kind):
                return item.payload


async def audio_stats(page: Page) -> dict[str, float]:
    stats = await page.evaluate(INBOUND_AUDIO)
    assert stats is not None
    return dict(stats)


async def test_page_prefers_webrtc_and_hears_the_voice_track(
    nursery: trio.Nursery, chromium_path: str, tmp_path: Path
) -> None:
    net = bridge_on_hub(nursery, {JUNIPER.id: JUNIPER}, token="tok")
    bridge, companion = net.bridge, net.companion
    async with serve_webrtc(bridge, net.node, synthesizer=EspeakSynthesizer()) as gateway:
        port = await nursery.start(bridge.serve)
        browser = chromium_with_webrtc(chromium_path, tmp_path)
        async with chromium(browser, tmp_path / "profile") as page:
            await page.before_load(SPEECH_STUB)  # so a page that spoke by itself would be seen
            await page.goto(f"http://127.0.0.1:{port}/?token=tok&as=user_tester&voice=speak")
            await page.wait_for(
                "document.getElementById('status').dataset.transport === 'webrtc'", timeout=20
            )
            assert await page.evaluate("window.companionLink.transport()") == "webrtc"
            assert len(gateway.sessions) == 1
            session = next(iter(gateway.sessions.values()))
            assert session.voice_on
            with trio.fail_after(10):
                while bridge.client_count != 1:  # the page's WebSocket was closed after the upgrade
                    await bridge.wait_for_clients(1)

            # a reply arrives over the data channel and is shown
            reply = Message.create(JUNIPER.id, ["user_tester"], "Clear skies tonight.", {"emotion": "happy"})
            await companion.publish(MESSAGES, reply)
            await page.wait_for(
                "[...document.querySelectorAll('#transcript li.message')]"
                ".some(li => li.textContent.includes('Clear skies tonight.'))"
            )

            # the person writes; the message leaves over the data channel
            await page.evaluate(
                "document.getElementById('to').value = 'companion_juniper';"
                "document.getElementById('text').value = 'What can you see?';"
                "document.getElementById('composer').requestSubmit();"
            )
            sent = await from_page(companion, Message)
            assert isinstance(sent, Message) and sent.params.message == "What can you see?"
            assert session.stats.frames_in >= 1

            # a speak query: the bridge voices it on the RTP track and answers it after the audio
            before = await audio_stats(page)
            query = Query.create(
                JUNIPER.id, "speak", {"message": "Saturn is up, low in the south.", "emotion": "happy"}
            )
            await companion.publish(QUERIES, query)
            await page.wait_for("document.querySelector('#companions li.speaking') !== null")
            result = await from_page(companion, QueryResult, timeout=20)
            assert isinstance(result, QueryResult) and result.id == query.id
            assert result.result is not None and result.result.success
            assert result.result.body["spoken"] is True and "espeak" in result.result.body["voice"]
            after = await audio_stats(page)
            assert after["packets"] - before["packets"] > 50  # over a second of RTP audio
            assert after["energy"] > before["energy"]  # and it was not silence
            assert await page.evaluate("window.__speech.spoken.length") == 0  # the page did not speak itself
            await page.wait_for("document.querySelector('#companions li.speaking') === null")

            # voice off: the bridge stops answering speak queries, the page answers them itself
            await page.evaluate(
                "const v = document.getElementById('voice-mode'); v.value = 'silent';"
                "v.dispatchEvent(new Event('change'));"
            )
            await page.wait_for("!document.getElementById('status').textContent.includes('voice')")
            assert not session.voice_on
            silent = Query.create(JUNIPER.id, "speak", {"message": "quietly"})
            await companion.publish(QUERIES, silent)
            answered = await from_page(companion, QueryResult)
            assert isinstance(answered, QueryResult) and answered.id == silent.id
            assert answered.result is not None and answered.result.body == {"spoken": False, "shown": True}
            assert not page.cdp.exceptions, page.cdp.exceptions

            # leaving the page closes the peer connection: the session ends and is cleaned up
            await page.call("Page.navigate", {"url": "about:blank"})
            with trio.fail_after(10):
                await gateway.wait_for_sessions(0)
            assert session.end_reason is not None and "closed" in session.end_reason


async def test_page_stays_on_websocket_when_webrtc_is_not_offered(
    nursery: trio.Nursery, chromium_path: str, tmp_path: Path
) -> None:
    net = bridge_on_hub(nursery)  # no /webrtc/offer
    bridge, companion = net.bridge, net.companion
    port = await nursery.start(bridge.serve)
    async with chromium(chromium_with_webrtc(chromium_path, tmp_path), tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/?as=user_tester&voice=silent")
        await page.wait_for("document.getElementById('status').dataset.transport === 'websocket'", timeout=20)
        assert await page.evaluate("window.companionLink.transport()") == "websocket"
        await page.wait_for(
            "[...document.querySelectorAll('#transcript li.system')]"
            ".some(li => li.textContent.includes('WebRTC unavailable'))"
        )
        query = Query.create(JUNIPER.id, "speak", {"message": "over the socket"})
        await companion.publish(QUERIES, query)
        answered = await from_page(companion, QueryResult)
        assert isinstance(answered, QueryResult) and answered.id == query.id
        assert json.loads(answered.model_dump_json())["result"]["body"] == {"spoken": False, "shown": True}
