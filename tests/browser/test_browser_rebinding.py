"""DNS rebinding in a real browser: a page from ``evil.example`` whose name then reaches the bridge.

The attack, played exactly: Chromium resolves ``evil.example`` to 127.0.0.1
(``--host-resolver-rules``). First the attacker's server answers on a port and serves its page;
then it goes away and the bridge takes that very port, as if the name had been rebound to the
bridge's address. The page, still loaded and same-origin with ``http://evil.example:PORT``,
reads ``/companions`` and opens a WebSocket: its requests carry ``Host`` *and* ``Origin`` of
``evil.example``. The bridge must give it nothing, and still serve its own page.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from browser.browser_cdp import chromium
from companion.protocol import MESSAGES, Message
from support.cards import metadata as md

if TYPE_CHECKING:
    # tests/browser/conftest.py, by the name mypy gives it (tests/ is its package base); at run
    # time pytest imports it as "conftest", and MakeBridge is needed only in annotations
    from browser.conftest import MakeBridge

PIM = md("pim", name="Pim", personality="bright", story="a secret story")

ATTACK_PAGE = b"""<!doctype html><html><head><title>evil</title></head><body><script>
window.attack = async () => {
  const out = {};
  for (const path of ["/companions", "/", "/app.js"]) {
    try {
      const response = await fetch(path, { cache: "no-store" });
      out[path] = response.status;
      out[path + " body"] = (await response.text()).slice(0, 300);
    } catch (err) {
      out[path] = "error";
    }
  }
  out.websocket = await new Promise((resolve) => {
    const ws = new WebSocket(`ws://${location.host}/`);
    ws.onopen = () => { resolve("open"); ws.close(); };
    ws.onerror = () => resolve("error");
    setTimeout(() => resolve("no answer"), 8000);
  });
  return JSON.stringify(out);
};
</script></body></html>"""


async def serve_attacker(stream: trio.SocketStream) -> None:
    """The attacker's server: the page for any request, then close."""
    with trio.move_on_after(5):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
            f"Cache-Control: no-store\r\nContent-Length: {len(ATTACK_PAGE)}\r\n\r\n"
        )
        await stream.send_all(head.encode() + ATTACK_PAGE)
    await stream.aclose()


async def test_a_rebinding_page_gets_nothing_from_the_bridge(
    nursery: trio.Nursery, memory_bridge: MakeBridge, chromium_path: str, tmp_path: Path
) -> None:
    attacker_scope = trio.CancelScope()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = int(listeners[0].socket.getsockname()[1])

    async def attacker() -> None:
        with attacker_scope:
            await trio.serve_listeners(serve_attacker, listeners)

    nursery.start_soon(attacker)
    rules = "--host-resolver-rules=MAP evil.example 127.0.0.1"
    async with chromium(chromium_path, tmp_path / "profile", extra_args=[rules]) as page:
        await page.goto(f"http://evil.example:{port}/")
        assert await page.evaluate("document.title") == "evil"
        # the name now reaches the bridge: same port, same origin for the page
        attacker_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        served = await memory_bridge({PIM.id: PIM}, port=port)
        bridge, companion = served.bridge, served.companion

        got: dict[str, Any] = json.loads(await page.evaluate("window.attack()", timeout=30))
        assert got["/companions"] == 421, got
        assert "a secret story" not in got["/companions body"]
        assert got["/"] == 421 and got["/app.js"] == 421, got
        assert got["websocket"] == "error", got
        assert bridge.client_count == 0

        # the bridge's own page, opened by its address, works as ever
        await page.goto(f"http://127.0.0.1:{port}/?as=user_tester&transport=ws")
        await page.wait_for("document.getElementById('status').dataset.state === 'connected'")
        await page.wait_for("document.getElementById('companions').textContent.includes('Pim')")
        await companion.publish(MESSAGES, Message.create("companion_pim", ["user_tester"], "Still here."))
        await page.wait_for("document.getElementById('transcript').textContent.includes('Still here.')")
