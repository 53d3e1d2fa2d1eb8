"""The page as a person uses it, on a desktop (1280 px) and a phone (390 px, Japanese), against
a real ``companion run --ws`` process: the three shipped cards (Pim with its face), the offline
model, the stores on disk.

What a person must see: conversation and never protocol (no ``companion.tools`` line), the
composer in view however long the talk, faces and profiles, a timestamp on every line, a Stop
that ends the conversation on every companion, the history again after a reload, an export,
and the page's own words in Japanese under a Japanese browser. With
``COMPANION_SCREENSHOT_DIR=DIR`` the tests save ``browser.png`` (desktop) and
``browser-phone.png`` (phone) there: the pictures in docs/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from browser.browser_cdp import Page, chromium
from companion.app.lines import BRIDGE_LINE, parse_sees
from support.live import start_run, stdout_line
from support.live_bridge import blocking
from support.network import Proc, network

pytestmark = pytest.mark.integration

CARDS = Path(__file__).resolve().parents[2] / "cards"
IDS = ("companion_juniper", "companion_ostra", "companion_pim")
EVERYONE = frozenset(IDS)
REPLIES = "document.querySelectorAll('#transcript li.message:not(.mine)').length"
COMPOSER_IN_VIEW = """(() => {
  const send = document.getElementById('send').getBoundingClientRect();
  const text = document.getElementById('text').getBoundingClientRect();
  return send.top >= 0 && send.bottom <= innerHeight && send.right <= innerWidth &&
    text.left >= 0 && text.width >= 120 && document.documentElement.scrollWidth <= innerWidth;
})()"""
SHOTS = os.environ.get("COMPANION_SCREENSHOT_DIR")


@asynccontextmanager
async def companions_with_a_bridge(tmp_path: Path) -> AsyncIterator[tuple[Proc, int]]:
    """The shipped cards in one ``companion run --ws`` process; its port, once all three see
    each other."""
    cards = [CARDS / f"{cid.removeprefix('companion_')}.yaml" for cid in IDS]
    with network(tmp_path) as net:
        home = await blocking(
            start_run, net, "home", cards, extra=("--ws", "127.0.0.1:0", "--no-webrtc", "--no-voice")
        )
        line = await blocking(stdout_line, home, lambda s: s.startswith(BRIDGE_LINE), 30)
        port = int(line[len(BRIDGE_LINE) :].strip().rstrip("/").rsplit(":", 1)[1])
        for cid in IDS:
            await blocking(stdout_line, home, lambda s, c=cid: parse_sees(s) == (c, EVERYONE), 30)
        yield home, port


async def say(page: Page, text: str) -> None:
    await page.evaluate(
        f"document.getElementById('text').value = {json.dumps(text)};"
        "document.getElementById('send').click(); true"
    )


async def stop_and_check_every_companion(page: Page, home: Proc) -> str:
    """Click Stop: the end marker follows the stop line, and every companion ends the
    conversation for the stop's message (its log), nobody speaking after it."""
    await page.evaluate("document.getElementById('stop').click(); true")
    stop_id = await page.wait_for("document.querySelector('#transcript li.system.stopped')?.dataset.id")
    await page.wait_for("document.querySelector('#transcript li.system.stopped ~ li.system.end')")
    for cid in IDS:
        over = await blocking(home.event, "conversation_over", 20, companion=cid, message_id=stop_id)
        assert over["closing"] == "terminal"
    key = ("speaker_chosen", stop_id)
    chosen = [e for e in list(home.events) if (e.get("event"), e.get("message_id")) == key]
    assert chosen and all(e["speaker"] is None and e["reason"] == "terminal" for e in chosen), chosen
    # and nobody goes on: no companion's line after the end (the offline model answers in ms).
    # A reply published before its companion took in the stop may still be on its way to the
    # page (a fresh-clone run counted one arriving after the count): it is counted once shown.
    published = json.dumps([e["reply_id"] for e in list(home.events) if e.get("event") == "replied"])
    await page.wait_for(
        f"{published}.every(id => [...document.querySelectorAll('#transcript li[data-id]')]"
        ".some(li => li.dataset.id === id))"
    )
    lines = await page.evaluate(REPLIES)
    await trio.sleep(2)
    assert await page.evaluate(REPLIES) == lines
    return str(stop_id)


def in_flight(home: Proc, line_id: str, stop_id: str) -> None:
    """``line_id`` is a companion's reply published before that companion took in the stop."""
    replied = [e for e in list(home.events) if e.get("event") == "replied" and e.get("reply_id") == line_id]
    assert len(replied) == 1, (line_id, replied)
    who = replied[0]["companion"]
    over = [
        e
        for e in list(home.events)
        if (e.get("event"), e.get("companion"), e.get("message_id")) == ("conversation_over", who, stop_id)
    ]
    assert over and replied[0]["ts"] <= over[0]["ts"], (replied, over)


async def test_the_page_on_a_desktop(chromium_path: str, tmp_path: Path) -> None:
    async with (
        companions_with_a_bridge(tmp_path) as (home, port),
        chromium(chromium_path, tmp_path / "p", width=1280, height=800, extra_args=["--lang=en-US"]) as page,
    ):
        await page.goto(f"http://127.0.0.1:{port}/?as=user_mika&voice=silent&transport=ws")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        await page.wait_for(f"document.querySelectorAll('#companions li[data-id]').length === {len(IDS)}")
        # faces: Pim's image from beside its card, the others' initials on their card's colour
        await page.wait_for(
            "document.querySelector('#companions li[data-id=companion_pim] .face img')?.naturalWidth > 0"
        )
        juniper = await page.evaluate(
            "(() => { const f = document.querySelector('#companions li[data-id=companion_juniper] .face');"
            " return [f.textContent, getComputedStyle(f).backgroundColor]; })()"
        )
        assert juniper == ["J", "rgb(74, 111, 165)"]  # the card's #4a6fa5

        await say(page, "Hello everyone! What are you all up to today?")
        await page.wait_for(f"{REPLIES} >= 3", timeout=60)
        text = await page.evaluate("document.getElementById('transcript').textContent")
        assert "companion.tools" not in text and '{"' not in text, text
        # a time on every line said
        assert await page.evaluate(
            "[...document.querySelectorAll('#transcript li.message')]"
            ".every(li => li.querySelector('time')?.dateTime)"
        )
        assert await page.evaluate(COMPOSER_IN_VIEW)
        if SHOTS:
            await page.screenshot(Path(SHOTS) / "browser.png")

        # the profile: personality and story, on a click
        await page.evaluate("document.querySelector('#companions li[data-id=companion_ostra]').click(); true")
        await page.wait_for("document.getElementById('profile').open")
        profile = await page.evaluate("document.getElementById('profile').textContent")
        assert "Ostra" in profile and "Personality" in profile and "Story" in profile
        await page.evaluate("document.querySelector('#profile button[value=close]').click(); true")
        await page.wait_for("!document.getElementById('profile').open")

        # a new line, and Stop at its first reply: the conversation is under way (a closing
        # takes at least six replies), and Stop ends it for every companion
        before = await page.evaluate(REPLIES)
        await say(page, "One more question: what should we do tonight?")
        await page.wait_for(f"{REPLIES} > {before}", timeout=60)
        stop_id = await stop_and_check_every_companion(page, home)
        said = await page.evaluate(
            "[...document.querySelectorAll('#transcript li[data-id]')].map(li => li.dataset.id)"
        )

        # a reload: the conversation comes back from the companions' stores, with its times
        await page.goto(f"http://127.0.0.1:{port}/?as=user_mika&voice=silent&transport=ws")
        await page.wait_for(f"document.querySelector('#transcript li[data-id={json.dumps(stop_id)}]')")
        again = await page.evaluate(
            "[...document.querySelectorAll('#transcript li[data-id]')].map(li => li.dataset.id)"
        )
        # every line again (lines a few ms apart may swap: the stores' times, not arrival here),
        # and whatever comes after the stop, on the page or from the stores, is a reply its
        # companion had already published when the stop reached it: in flight at the click
        assert sorted(again) == sorted(said)
        after = set(said[said.index(stop_id) + 1 :]) | set(again[again.index(stop_id) + 1 :])
        for line_id in after:
            in_flight(home, line_id, stop_id)
        assert await page.evaluate("!!document.querySelector('li.system.stopped + li.system.end')")
        assert await page.evaluate("document.querySelectorAll('#transcript li.message time').length") >= 4

        markdown = await page.evaluate("window.companionExport('md')")
        assert "Hello everyone! What are you all up to today?" in markdown and "**Pim**" in markdown
        exported = json.loads(await page.evaluate("window.companionExport('json')"))
        assert [m["id"] for m in exported["messages"]] == again
        assert all(m["at"].endswith("Z") for m in exported["messages"])
        assert page.cdp.exceptions == [], page.cdp.exceptions


@pytest.mark.skipif(
    shutil.which("fc-list") is None
    or not subprocess.run(
        ["fc-list", ":lang=ja"], capture_output=True, text=True, check=False
    ).stdout.strip(),
    reason="no Japanese font (scripts/system-deps.sh installs Debian's fonts-noto-cjk)",
)
async def test_the_page_on_a_phone_in_japanese(chromium_path: str, tmp_path: Path) -> None:
    async with (
        companions_with_a_bridge(tmp_path) as (home, port),
        chromium(
            chromium_path,
            tmp_path / "profile",
            width=390,
            height=844,
            extra_args=["--lang=ja-JP", "--accept-lang=ja-JP,ja"],
        ) as page,
    ):
        await page.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True},
        )
        await page.goto(f"http://127.0.0.1:{port}/?as=user_mika&voice=silent&transport=ws")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        # the browser's language picks the page's words
        assert await page.evaluate("[navigator.language, document.documentElement.lang]") == ["ja-JP", "ja"]
        assert await page.evaluate("document.getElementById('send').textContent") == "送信"
        hint = await page.evaluate("document.querySelector('li.system.hint').textContent")
        assert "全員に話しかけます" in hint
        # a CJK font draws it (the fonts Chromium used for the button's text)
        await page.call("DOM.enable")
        await page.call("CSS.enable")
        root = (await page.call("DOM.getDocument"))["root"]["nodeId"]
        send = (await page.call("DOM.querySelector", {"nodeId": root, "selector": "#send"}))["nodeId"]
        used = await page.call("CSS.getPlatformFontsForNode", {"nodeId": send})
        assert any("CJK" in f["familyName"] for f in used["fonts"]), used

        # the companion list is a drawer: out of view until asked for
        await page.wait_for(f"document.querySelectorAll('#companions li[data-id]').length === {len(IDS)}")
        assert await page.evaluate("document.getElementById('drawer').getBoundingClientRect().right <= 0")
        await page.evaluate("document.getElementById('drawer-toggle').click(); true")
        await page.wait_for("document.getElementById('drawer').getBoundingClientRect().left >= 0")
        await page.evaluate("document.getElementById('scrim').click(); true")
        await page.wait_for("document.getElementById('drawer').getBoundingClientRect().right <= 0")

        # a stop in the middle of a conversation ends it at once
        await say(page, "こんにちは!今日は何をしていますか?")
        await page.wait_for(f"{REPLIES} >= 1", timeout=60)
        await stop_and_check_every_companion(page, home)
        end = await page.evaluate("document.querySelector('#transcript li.system.end').textContent")
        assert end == "— 会話が終わりました。下に書くと新しい会話が始まります —"
        assert await page.evaluate("document.getElementById('stop').disabled")  # nothing to stop

        # a long conversation: the composer stays in view, the transcript scrolls
        await say(page, "パンの話をもっと聞かせて。")
        assert not await page.evaluate("document.getElementById('stop').disabled")
        await page.wait_for(f"{REPLIES} >= 5", timeout=60)
        await page.wait_for("(t => t.scrollHeight > t.clientHeight)(document.getElementById('transcript'))")
        assert await page.evaluate(COMPOSER_IN_VIEW)
        text = await page.evaluate("document.getElementById('transcript').textContent")
        assert "companion.tools" not in text and '{"' not in text
        if SHOTS:
            await page.screenshot(Path(SHOTS) / "browser-phone.png")

        assert page.cdp.exceptions == [], page.cdp.exceptions
