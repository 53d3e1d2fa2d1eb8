"""The web page in headless Chromium against a bridge whose network is a MemoryHub."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from browser.browser_cdp import SPEECH_STUB, VOICE_COUNT, Page, chromium
from companion.bridge.ratelimit import RateLimit
from companion.memory import Inbound, MemoryEndpoint
from companion.protocol import (
    ACTIONS,
    MESSAGES,
    QUERIES,
    STATES,
    Action,
    Message,
    Query,
    QueryResult,
    State,
)
from support.cards import metadata as md

if TYPE_CHECKING:
    # tests/browser/conftest.py, by the name mypy gives it (tests/ is its package base); at run
    # time pytest imports it as "conftest", and MakeBridge is needed only in annotations
    from browser.conftest import MakeBridge

JUNIPER = md("juniper", name="Juniper", personality="calm")
PIM = md("pim", name="Pim", personality="bright")


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
    memory_bridge: MakeBridge, chromium_path: str, tmp_path: Path
) -> None:
    served = await memory_bridge({JUNIPER.id: JUNIPER, PIM.id: PIM}, token="tok")
    companion, port = served.companion, served.port

    async with chromium(chromium_path, tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/?token=tok&as=user_tester&voice=speak")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        await page.wait_for("document.getElementById('companions').textContent.includes('Juniper')")
        # the start hint says how to write to the companions
        hint = await page.evaluate("document.querySelector('#transcript li.system.hint')?.textContent")
        assert "talk to every companion" in hint and "“to”" in hint

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

        # the companions' last word is followed by the end-of-conversation marker
        last = Message.create(
            "companion_pim", ["user_tester", "companion_juniper"], "Good night, all.", {"closing": "terminal"}
        )
        await companion.publish(MESSAGES, last)
        marker = await page.wait_for("document.querySelector('#transcript li.system.end')?.textContent")
        before = await page.evaluate(
            "document.querySelector('#transcript li.system.end').previousElementSibling.textContent"
        )
        assert "Good night, all." in before
        assert "write below to start a new one" in marker
        assert await page.evaluate("document.querySelectorAll('#transcript li.system.end').length") == 1

        shot = os.environ.get("COMPANION_SCREENSHOT")
        if shot:
            await page.screenshot(Path(shot))
        assert page.cdp.exceptions == [], page.cdp.exceptions


async def test_page_without_token_says_a_token_is_needed_and_how_to_give_it(
    memory_bridge: MakeBridge, chromium_path: str, tmp_path: Path
) -> None:
    served = await memory_bridge(token="tok")
    bridge, companion, port = served.bridge, served.companion, served.port
    async with chromium(chromium_path, tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/?as=user_tester")
        status = await page.wait_for(
            "document.getElementById('status').dataset.state === 'refused' && "
            "document.getElementById('status').textContent"
        )
        assert status == "token needed"
        why = await page.wait_for(
            "!document.getElementById('token-form').hidden && "
            "document.getElementById('token-why').textContent"
        )
        assert "needs a token" in why and "?token=" in why
        line = await page.evaluate(
            "[...document.querySelectorAll('#transcript li.system.error')].map(li => li.textContent).join()"
        )
        assert "requires a token" in line
        assert bridge.client_count == 0
        assert json.loads(await page.evaluate("JSON.stringify(document.title)")) == "companion"
        # a wrong token is told apart from a missing one
        await page.goto(f"http://127.0.0.1:{port}/?as=user_tester&token=nope")
        status = await page.wait_for(
            "document.getElementById('status').dataset.state === 'refused' && "
            "document.getElementById('status').textContent"
        )
        assert status == "wrong token"
        # pasting the right token reconnects the page, which then works as usual
        await page.evaluate(
            "document.getElementById('token').value = 'tok';"
            "document.querySelector('#token-form button').click(); true"
        )
        await page.wait_for("location.search.includes('token=tok')")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        await companion.publish(MESSAGES, Message.create("companion_pim", ["user_tester"], "Hello!"))
        await page.wait_for("document.getElementById('transcript').textContent.includes('Hello!')")
        assert page.cdp.exceptions == [], page.cdp.exceptions


async def test_a_refused_message_is_marked_not_sent(
    memory_bridge: MakeBridge, chromium_path: str, tmp_path: Path
) -> None:
    """Over the rate limit, the bridge answers ``rate_limited``; the page shows which line
    did not go out instead of pretending it did."""
    limit = RateLimit(rate=0.1, burst=2)  # the session frame and one line
    served = await memory_bridge({PIM.id: PIM}, client_rate=limit)
    companion, port = served.companion, served.port
    async with chromium(chromium_path, tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/?as=user_tester&transport=ws")
        await page.wait_for("document.getElementById('companions').textContent.includes('Pim')")
        for text in ("first line", "second line"):
            await page.evaluate(
                f"document.getElementById('text').value = '{text}';"
                "document.getElementById('send').click(); true"
            )
        sent = await from_page(companion, MESSAGES)
        assert isinstance(sent.payload, Message) and sent.payload.params.message == "first line"
        note = await page.wait_for("document.querySelector('#transcript li.refused')?.textContent")
        assert "second line" in note and "not sent: too many frames" in note
        assert await page.evaluate("document.querySelectorAll('#transcript li.refused').length") == 1
        assert page.cdp.exceptions == [], page.cdp.exceptions


async def test_an_approval_given_after_a_reconnection_is_accepted(
    memory_bridge: MakeBridge, chromium_path: str, tmp_path: Path
) -> None:
    """The bridge takes a result only from the client it sent the query to; the page is one
    client across its connections (its session key), so a person approving after the link
    dropped and came back is still heard."""
    served = await memory_bridge({PIM.id: PIM})
    bridge, companion, port = served.bridge, served.companion, served.port
    async with chromium(chromium_path, tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/?as=user_tester&transport=ws")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        body = {"call_id": "c1", "action": "order_tea", "preview": "order 2 teas"}
        await companion.publish(QUERIES, Query.create("companion_pim", "approval", body, id="a1"))
        await page.wait_for("document.querySelector('.approval .preview')?.textContent === 'order 2 teas'")
        for session in list(bridge._sessions.values()):  # the link drops; the page reconnects
            session.scope.cancel()
        await page.wait_for("document.getElementById('status').dataset.state === 'closed'")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        with trio.fail_after(5):
            await bridge.wait_for_clients(1)
        await page.evaluate("document.querySelector('.approval button.approve').click(); true")
        answer = await from_page(companion, QUERIES)
        assert isinstance(answer.payload, QueryResult) and answer.payload.id == "a1"
        assert answer.payload.result is not None and answer.payload.result.body["approved"] is True
        assert bridge.stats()["refused"] == {}
        assert page.cdp.exceptions == [], page.cdp.exceptions


async def test_page_shows_thinking_counting_then_the_failure_then_the_end(
    memory_bridge: MakeBridge, chromium_path: str, tmp_path: Path
) -> None:
    """The signals as companions publish them: "is thinking… (N s)" counts up once a second
    (each text set once: no flicker), a yield is one line with its reason and its detail as
    text (never HTML), and the end marker comes once, from the states array that ends it."""
    served = await memory_bridge({JUNIPER.id: JUNIPER, PIM.id: PIM})
    companion, port = served.companion, served.port
    async with chromium(chromium_path, tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/?as=user_tester&transport=ws")
        await page.wait_for("document.getElementById('companions').textContent.includes('Pim')")
        await page.evaluate(
            """(() => {
              // every text the thinking line takes, and how often the page writes there
              window.__thinkingTexts = [];
              window.__writes = 0;
              new MutationObserver((records) => {
                window.__writes += records.filter((r) => r.target.closest?.('#thinking') ||
                  r.target.parentElement?.closest('#thinking')).length;
                for (const p of document.querySelectorAll('#thinking p')) {
                  const last = window.__thinkingTexts[window.__thinkingTexts.length - 1];
                  if (p.textContent !== last) window.__thinkingTexts.push(p.textContent);
                }
              }).observe(document.body, {subtree: true, childList: true, characterData: true});
              return true;
            })()"""
        )
        thinking = {"in_reply_to": "m-1"}
        await companion.publish(ACTIONS, Action.create("companion_juniper", "companion.thinking", thinking))
        await page.wait_for(
            "document.querySelector('#thinking p')?.textContent === 'Juniper is thinking… (0 s)'"
        )
        assert await page.evaluate("document.getElementById('thinking').hidden") is False
        assert (
            await page.evaluate("document.querySelector('#companions li.thinking')?.dataset.id")
            == "companion_juniper"
        )
        await page.wait_for(
            "document.querySelector('#thinking p')?.textContent === 'Juniper is thinking… (2 s)'", timeout=6
        )
        texts = await page.evaluate("window.__thinkingTexts")
        assert texts == [f"Juniper is thinking… ({n} s)" for n in range(3)]
        assert await page.evaluate("window.__writes") <= 5  # the line added, then one text per second

        detail = '<img src=x onerror="window.__pwned=1"> the server ignored the forced tool call'
        params = {"in_reply_to": "m-1", "reason": "model_error", "detail": detail}
        await companion.publish(ACTIONS, Action.create("companion_juniper", "companion.yield", params))
        failed = await page.wait_for("document.querySelector('#transcript li.system.failure')?.textContent")
        assert failed == (
            'Juniper could not answer: the model failed (<img src=x onerror="window.__pwned=1"> the server '
            "ignored the forced tool call); the turn passes to the next companion"
        )
        assert await page.evaluate("document.querySelectorAll('#transcript img, #thinking img').length") == 0
        assert await page.evaluate("window.__pwned === undefined") is True
        await page.wait_for("document.getElementById('thinking').hidden")
        assert await page.evaluate("document.querySelectorAll('#thinking p').length") == 0

        # the stand-in replies in the closing stage; the leader's array after it ends the conversation
        await companion.publish(
            ACTIONS, Action.create("companion_pim", "companion.thinking", {"in_reply_to": "m-1"})
        )
        await page.wait_for(
            "document.querySelector('#thinking p')?.textContent.startsWith('Pim is thinking')"
        )
        last = Message.create(
            "companion_pim", ["user_tester"], "Good night.", {"in_reply_to": "m-1", "closing": "closing"}
        )
        await companion.publish(MESSAGES, last)
        await page.wait_for("document.getElementById('thinking').hidden")
        end = [
            State.create("companion_juniper", "speak", 6, False, "terminal"),
            State.create("companion_pim", "listen", 2, False, "terminal"),
        ]
        await companion.publish(STATES, end)
        marker = await page.wait_for("document.querySelector('#transcript li.system.end')?.textContent")
        assert "write below to start a new one" in marker
        before = await page.evaluate(
            "document.querySelector('#transcript li.system.end').previousElementSibling.textContent"
        )
        assert "Good night." in before
        # another leader's array and a terminal yield: the yield's line, no second marker
        await companion.publish(STATES, end)
        params = {"in_reply_to": "m-2", "reason": "terminal"}
        await companion.publish(ACTIONS, Action.create("companion_juniper", "companion.yield", params))
        over = await page.wait_for("document.querySelector('#transcript li.system.over')?.textContent")
        assert over == "Juniper has nothing more to say; the turn passes to the next companion"
        assert await page.evaluate("document.querySelectorAll('#transcript li.system.end').length") == 1

        # the person's next line starts a new conversation, which ends with its own marker
        await page.evaluate(
            "document.getElementById('text').value = 'One more question';"
            "document.getElementById('send').click(); true"
        )
        await from_page(companion, MESSAGES)
        params = {"in_reply_to": "m-3", "reason": "terminal"}
        await companion.publish(ACTIONS, Action.create("companion_pim", "companion.yield", params))
        await page.wait_for("document.querySelectorAll('#transcript li.system.over').length === 2")
        # one companion's limit is not the end (cards differ): the closing array is
        assert await page.evaluate("document.querySelectorAll('#transcript li.system.end').length") == 1
        await companion.publish(STATES, end)
        await page.wait_for("document.querySelectorAll('#transcript li.system.end').length === 2")

        # a thinking that never ends has a deadline: the page's clock moved on by 300 s
        await companion.publish(
            ACTIONS, Action.create("companion_pim", "companion.thinking", {"in_reply_to": "m-4"})
        )
        await page.wait_for("document.querySelector('#thinking p')?.textContent === 'Pim is thinking… (0 s)'")
        await page.evaluate(
            "(() => { const real = performance.now.bind(performance);"
            " performance.now = () => real() + 300000; return true; })()"
        )
        gone = await page.wait_for(
            "[...document.querySelectorAll('#transcript li.system')].map(li => li.textContent)"
            ".find(t => t.startsWith('(no word from'))"
        )
        assert gone == "(no word from Pim after 300 s of thinking)"
        await page.wait_for("document.getElementById('thinking').hidden")
        assert page.cdp.exceptions == [], page.cdp.exceptions


async def test_speaking_indicator_pace_and_mute(
    memory_bridge: MakeBridge, chromium_path: str, tmp_path: Path
) -> None:
    """While a line is voiced its companion pulses and the line shows above the composer; the
    pace setting holds the report that it was said (companions that voice wait for it); a
    companion muted on this page is not voiced (answered at once) and its lines are dimmed."""
    served = await memory_bridge({JUNIPER.id: JUNIPER, PIM.id: PIM})
    companion, port = served.companion, served.port
    async with chromium(chromium_path, tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/?as=user_tester&voice=speak&pace=1&transport=ws")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        await page.wait_for("document.getElementById('companions').textContent.includes('Pim')")
        if not await use_speech_stub_if_voiceless(page):
            pytest.skip("this Chromium has a real voice: the test needs to decide when a line ends")
        await companion.publish(
            QUERIES, Query.create("companion_juniper", "speak", {"message": "Twinkle."}, id="v1")
        )
        shown = await page.wait_for(
            "!document.getElementById('speaking').hidden && document.getElementById('speaking').textContent"
        )
        assert shown == "Juniper: Twinkle."
        assert (
            await page.evaluate("document.querySelector('#companions li.speaking')?.dataset.id") == JUNIPER.id
        )
        assert await page.evaluate("window.__finishSpeech()") is True
        await page.wait_for("document.getElementById('speaking').hidden")
        await trio.sleep(0.3)
        assert nothing_from_page(companion, QUERIES), "reported before the pause after the line"
        result = await from_page(companion, QUERIES, timeout=5)
        assert isinstance(result.payload, QueryResult) and result.payload.id == "v1"

        # mute Pim from its profile: not voiced, answered at once; its lines dimmed
        await page.evaluate("document.querySelector('#companions li[data-id=companion_pim]').click(); true")
        await page.wait_for("document.getElementById('profile').open")
        await page.evaluate("document.getElementById('profile-mute').click(); true")
        await page.evaluate("document.querySelector('#profile button[value=close]').click(); true")
        await companion.publish(
            QUERIES, Query.create("companion_pim", "speak", {"message": "Psst."}, id="v2")
        )
        muted = await from_page(companion, QUERIES, timeout=5)
        assert isinstance(muted.payload, QueryResult) and muted.payload.id == "v2"
        assert muted.payload.result is not None and muted.payload.result.body == {
            "spoken": False,
            "shown": True,
        }
        assert "Psst." not in await page.evaluate("window.__speech.spoken")
        await companion.publish(MESSAGES, Message.create("companion_pim", ["user_tester"], "Psst."))
        await page.wait_for("document.querySelector('#transcript li.message.muted[data-from=companion_pim]')")
        assert await page.evaluate("JSON.parse(localStorage.getItem('companion.muted'))") == [PIM.id]
        assert page.cdp.exceptions == [], page.cdp.exceptions
