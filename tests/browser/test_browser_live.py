"""The web page in headless Chromium with a live network: companions with the conversation
engine in their own processes, a `companion bridge` process serving the page."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from browser.browser_cdp import SPEECH_STUB_TIMED, VOICE_COUNT, chromium
from support.live import start_live
from support.live_bridge import blocking
from support.network import network

pytestmark = pytest.mark.integration

MESSAGES_FROM = (
    "[...document.querySelectorAll('#transcript li.message')]"
    ".filter(li => li.dataset.from === {who!r}).map(li => li.querySelector('.bubble').textContent)"
)


PAGE_WAIT = 30.0
"""Seconds for the page to connect, list the companions and show the person's line: Chromium
and three companion processes starting on a busy machine (idle, it takes a second or two)."""


async def test_page_in_a_live_conversation(chromium_path: str, tmp_path: Path) -> None:
    """The page speaks the lines itself (its speech synthesis). The bridge gives WebRTC clients
    no voice (``--no-voice``): the page upgrades to WebRTC a moment after it connects, and with
    the bridge's voice every line voiced after the upgrade was played on the audio track
    instead, never by the page; whether Juniper's first line came before or after the upgrade
    was a race a busy machine lost (the test then waited for the page to say it, in vain)."""
    with network(tmp_path) as net:
        live = await blocking(start_live, net, bridge_args=("--no-voice",))
        async with chromium(chromium_path, tmp_path / "profile") as page:
            await page.goto(f"http://127.0.0.1:{live.port}/?as=user_tester&voice=speak")
            await page.wait_for("document.getElementById('status').dataset.state === 'connected'", PAGE_WAIT)
            listed = "document.getElementById('companions').textContent"
            await page.wait_for(f"['Juniper', 'Pim'].every(n => {listed}.includes(n))", PAGE_WAIT)
            if not await page.evaluate(VOICE_COUNT):
                await page.evaluate(SPEECH_STUB_TIMED)

            await page.evaluate(
                "document.getElementById('text').value = 'Hello both! What did you see tonight?';"
                "document.getElementById('send').click(); true"
            )
            await page.wait_for("document.querySelector('#transcript li.mine')", PAGE_WAIT)

            # replies from both companions appear; Juniper's line was spoken by the page first
            juniper = MESSAGES_FROM.format(who="companion_juniper")
            pim = MESSAGES_FROM.format(who="companion_pim")
            await page.wait_for(f"{pim}.length >= 1", timeout=60)
            # (a line is spoken a sentence at a time: the sentences, joined, hold it)
            spoken_then_shown = (
                f"{juniper}.length >= 1 && (!window.__speech || "
                f"{juniper}.every(t => window.__speech.spoken.join(' ').includes(t)))"
            )
            await page.wait_for(spoken_then_shown, timeout=60)
            line = await page.evaluate(
                "document.querySelector('#transcript li.message[data-from=\"companion_juniper\"] .meta')"
                ".textContent"
            )
            assert "Juniper →" in line and any(e in line for e in ("happy", "sad", "angry", "neutral"))

            # let the conversation run a little for the picture, then take it
            await page.wait_for("document.querySelectorAll('#transcript li.message').length >= 5", timeout=60)
            shot = os.environ.get("COMPANION_SCREENSHOT")
            if shot:
                await page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                await page.screenshot(Path(shot))
            # the conversation closes; the leader's last array (nobody speaks: terminal) reaches the
            # page through the bridge, which marks the end once
            await page.wait_for("document.querySelector('#transcript li.system.end')", timeout=90)
            marker = "document.querySelector('#transcript li.system.end')"
            # it follows the last reply (the message the array answers)
            assert await page.evaluate(f"{marker}.previousElementSibling.matches('.message, .action')")
            assert await page.evaluate("document.querySelectorAll('#transcript li.system.end').length") == 1
            assert page.cdp.exceptions == [], page.cdp.exceptions
