"""The page shows a line voiced a sentence at a time growing, then the whole message in its place."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from browser.browser_cdp import chromium
from browser.test_browser_page import JUNIPER, from_page
from companion.protocol import MESSAGES, QUERIES, Message, Query, QueryResult

if TYPE_CHECKING:
    from browser.conftest import MakeBridge

DRAFTS = "[...document.querySelectorAll('#transcript li.draft .bubble')].map(b => b.textContent)"
MESSAGES_SHOWN = "[...document.querySelectorAll('#transcript li.message .bubble')].map(b => b.textContent)"


async def test_a_voiced_line_grows_sentence_by_sentence_then_is_replaced_by_its_message(
    memory_bridge: MakeBridge, chromium_path: str, tmp_path: Path
) -> None:
    served = await memory_bridge({JUNIPER.id: JUNIPER}, token="tok")
    companion, port = served.companion, served.port
    async with chromium(chromium_path, tmp_path / "profile") as page:
        await page.goto(f"http://127.0.0.1:{port}/?token=tok&as=user_tester&voice=silent")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        sentences = ["The sea is calm.", "Three boats came in."]
        for part, sentence in enumerate(sentences):
            meta = {"line": "line-1", "part": part, "last": part == 1}
            body = {"message": sentence, "emotion": "happy"}
            await companion.publish(
                QUERIES, Query.create(JUNIPER.id, "speak", body, id=f"s{part}", metadata=meta)
            )
            answer = await from_page(companion, QUERIES)  # silent: answered once shown
            assert isinstance(answer.payload, QueryResult) and answer.payload.id == f"s{part}"
            shown = " ".join(sentences[: part + 1])
            assert await page.wait_for(f"{DRAFTS}.join('|') === {shown!r}") is True
        assert await page.evaluate(f"{MESSAGES_SHOWN}.length") == 0
        line = Message.create(JUNIPER.id, ["user_tester"], " ".join(sentences), {"emotion": "happy"})
        await companion.publish(MESSAGES, line)
        await page.wait_for(f"{MESSAGES_SHOWN}.includes({line.params.message!r})")
        assert await page.evaluate(f"{DRAFTS}.length") == 0, "the line is shown twice"
        assert page.cdp.exceptions == [], page.cdp.exceptions
