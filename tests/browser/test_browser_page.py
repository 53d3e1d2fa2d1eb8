"""The web page in headless Chromium against a bridge whose network is a MemoryHub."""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio
from browser_cdp import SPEECH_STUB, VOICE_COUNT, Page, chromium

from companion.bridge import Bridge, BridgeConfig
from companion.protocol import ACTIONS, MESSAGES, QUERIES, Action, Message, Metadata, Query, QueryResult
from companion.transport import Inbound, MemoryEndpoint, MemoryHub

JUNIPER = Metadata(id="companion_juniper", name="Juniper", personality="calm", story="s", sample="x")
PIM = Metadata(id="companion_pim", name="Pim", personality="bright", story="s", sample="x")


async def from_page(companion: MemoryEndpoint, topic: str, timeout: float = 10) -> Inbound:
    with trio.fail_after(timeout):
        while True:
            item = await companion.receive_channel.receive()
            if item.sender_peer == "bridge" and item.topic == topic:
                return item


def nothing_from_page(companion: MemoryEndpoint, topic: str) -> bool:
    while True:
        try:
            item = companion.receive_channel.receive_nowait()
        except trio.WouldBlock:
            return True
        if item.sender_peer == "bridge" and item.topic == topic:
            return False


async def use_speech_stub_if_voiceless(page: Page) -> bool:
    voices = await page.evaluate(VOICE_COUNT)
    if voices:
        return False
    await page.evaluate(SPEECH_STUB)
    return True


async def test_page_shows_sends_approves_and_speaks(
    nursery: trio.Nursery, chromium_path: str, tmp_path: Path
) -> None:
    hub = MemoryHub()
    bridge_ep = hub.endpoint("bridge")
    companion = hub.endpoint("companion")
    bridge = Bridge(
        bridge_ep,
        directory={JUNIPER.id: JUNIPER, PIM.id: PIM},
        config=BridgeConfig(port=0, token="tok"),
        self_peer="bridge",
    )
    nursery.start_soon(bridge.pump, bridge_ep.receive_channel)
    port = await nursery.start(bridge.serve)

    async with chromium(chromium_path, tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/?token=tok&as=user_tester&voice=speak")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        await page.wait_for("document.getElementById('companions').textContent.includes('Juniper')")

        # a reply from the network appears with the speaker's name and emotion
        reply = Message.create(
            "companion_juniper", ["user_tester", "companion_pim"], "Clear skies.", {"emotion": "happy"}
        )
        await companion.publish(MESSAGES, reply)
        line = await page.wait_for(
            "[...document.querySelectorAll('#transcript li.message')].map(li => li.textContent)"
            ".find(t => t.includes('Clear skies.'))"
        )
        assert "Juniper" in line and "you, Pim" in line and "happy" in line

        # the person writes to one companion and nominates the next speaker
        await page.evaluate(
            "document.getElementById('to').value = 'companion_pim';"
            "document.getElementById('next').value = 'companion_juniper';"
            "document.getElementById('text').value = 'What do you see tonight?';"
            "document.getElementById('send').click(); true"
        )
        sent = await from_page(companion, MESSAGES)
        assert isinstance(sent.payload, Message)
        assert sent.payload.params.from_ == "user_tester"
        assert sent.payload.params.to == ["companion_pim", "companion_juniper"]
        assert sent.payload.params.message == "What do you see tonight?"
        assert sent.payload.params.metadata == {"next_speaker": "companion_juniper"}
        await page.wait_for("document.querySelector('#transcript li.mine')")

        # actions are shown
        await companion.publish(ACTIONS, Action.create("companion_pim", "wave", {"hand": "left"}))
        await page.wait_for("document.querySelector('#transcript li.action')?.textContent.includes('wave')")

        # a speak query is answered when the utterance ends, not before
        stubbed = await use_speech_stub_if_voiceless(page)
        query = Query.create(
            "companion_juniper", "speak", {"message": "Saturn is up.", "emotion": "happy"}, id="s1"
        )
        await companion.publish(QUERIES, query)
        if stubbed:
            await page.wait_for("window.__speech.spoken.includes('Saturn is up.')")
            await page.wait_for("document.querySelector('#companions li.speaking')")
            assert nothing_from_page(companion, QUERIES), "answered before the utterance ended"
            assert await page.evaluate("window.__finishSpeech()") is True
        result = await from_page(companion, QUERIES, timeout=30)
        assert isinstance(result.payload, QueryResult) and result.payload.id == "s1"
        assert result.payload.result is not None and result.payload.result.success is True
        assert result.payload.result.body == {"spoken": True, "engine": "speechSynthesis"}

        # an approval request is a prompt; clicking Approve answers it
        body = {"call_id": "c1", "action": "order_tea", "description": "Order tea", "preview": "order 2 teas"}
        await companion.publish(QUERIES, Query.create("companion_pim", "approval", body, id="a1"))
        await page.wait_for("document.querySelector('.approval .preview')?.textContent === 'order 2 teas'")
        await page.evaluate("document.querySelector('.approval button.approve').click(); true")
        answer = await from_page(companion, QUERIES)
        assert isinstance(answer.payload, QueryResult) and answer.payload.id == "a1"
        assert answer.payload.result is not None
        assert answer.payload.result.body["approved"] is True
        await page.wait_for("!document.querySelector('.approval')")

        shot = os.environ.get("COMPANION_SCREENSHOT")
        if shot:
            await page.screenshot(Path(shot))
        assert page.cdp.exceptions == [], page.cdp.exceptions


async def test_page_without_token_is_refused_and_says_so(
    nursery: trio.Nursery, chromium_path: str, tmp_path: Path
) -> None:
    bridge = Bridge(MemoryHub().endpoint("bridge"), config=BridgeConfig(port=0, token="tok"))
    port = await nursery.start(bridge.serve)
    async with chromium(chromium_path, tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/")
        status = await page.wait_for(
            "document.getElementById('status').dataset.state === 'closed' && "
            "document.getElementById('status').textContent"
        )
        assert "disconnected" in status
        assert bridge.client_count == 0
        assert json.loads(await page.evaluate("JSON.stringify(document.title)")) == "companion"
