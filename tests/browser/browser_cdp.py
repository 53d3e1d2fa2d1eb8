"""A small Chrome DevTools Protocol driver for headless Chromium, on trio and trio-websocket.

Enough to open a page, run JavaScript in it, wait for the DOM to reach a state (with a
MutationObserver, not polling), install scripts before the page's own, and take screenshots.
Uses the distribution's Chromium; never downloads a browser.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from trio_websocket import WebSocketConnection, open_websocket_url

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")

SPEECH_STUB = """
(() => {
  // Headless Chromium has no voice: stand in for speechSynthesis so the test decides when an
  // utterance ends (a real one ends when its audio has played).
  const state = { spoken: [], pending: [] };
  window.__speech = state;
  speechSynthesis.speak = (utterance) => {
    state.spoken.push(utterance.text);
    state.pending.push(utterance);
    setTimeout(() => utterance.onstart && utterance.onstart(new Event("start")), 0);
  };
  speechSynthesis.cancel = () => {};
  window.__finishSpeech = () => {
    const utterance = state.pending.shift();
    if (utterance && utterance.onend) utterance.onend(new Event("end"));
    return Boolean(utterance);
  };
})();
"""

SPEECH_STUB_TIMED = """
(() => {
  // Headless Chromium has no voice: utterances "play" for a time that grows with their length.
  const state = { spoken: [] };
  window.__speech = state;
  speechSynthesis.speak = (utterance) => {
    state.spoken.push(utterance.text);
    setTimeout(() => utterance.onstart && utterance.onstart(new Event("start")), 0);
    const ms = Math.min(200 + utterance.text.length * 10, 1500);
    setTimeout(() => utterance.onend && utterance.onend(new Event("end")), ms);
  };
  speechSynthesis.cancel = () => {};
})();
"""

VOICE_COUNT = """
new Promise((resolve) => {
  const now = speechSynthesis.getVoices().length;
  if (now) { resolve(now); return; }
  speechSynthesis.addEventListener("voiceschanged", () => resolve(speechSynthesis.getVoices().length));
  setTimeout(() => resolve(speechSynthesis.getVoices().length), 1500);
})
"""


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure_chromium() -> str | None:
    """The system Chromium, installed from Debian's packages when missing (needs root)."""
    path = find_chromium()
    if path is not None:
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300, check=False)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
        env=env,
        capture_output=True,
        timeout=900,
        check=False,
    )
    return find_chromium()


class CdpError(RuntimeError):
    pass


_NAVIGATED = "Inspected target navigated or closed"
"""Chromium's answer to an evaluation whose page navigated away meanwhile."""


def _waiting_script(expression: str, timeout: float) -> str:
    """A promise that resolves with ``expression`` once truthy (checked on every DOM change) and
    rejects after ``timeout`` seconds."""
    return f"""
        new Promise((resolve, reject) => {{
          const check = () => {{
            let value;
            try {{ value = ({expression}); }} catch (e) {{ value = undefined; }}
            if (value) {{ observer.disconnect(); clearTimeout(timer); resolve(value); return true; }}
            return false;
          }};
          const observer = new MutationObserver(check);
          const timer = setTimeout(() => {{
            observer.disconnect();
            reject(new Error("timed out waiting for: " + {json.dumps(expression)}));
          }}, {int(timeout * 1000)});
          if (!check()) observer.observe(document, {{subtree: true, childList: true,
            characterData: true, attributes: true}});
        }})
    """


class Cdp:
    """One DevTools connection; commands are matched to answers by id, events kept per session."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._answers: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.console: list[str] = []
        self.exceptions: list[str] = []
        self.loaded = trio.Event()
        """Set by the next ``Page.loadEventFired`` (a new Event before each navigation)."""

    async def reader(self) -> None:
        while True:
            message = json.loads(await self._ws.get_message())
            if "id" in message:
                channel = self._answers.pop(message["id"], None)
                if channel is not None:
                    channel.send_nowait(message)
            elif message.get("method") == "Runtime.consoleAPICalled":
                args = message["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
            elif message.get("method") == "Page.loadEventFired":
                self.loaded.set()
            elif message.get("method") == "Runtime.exceptionThrown":
                details = message["params"]["exceptionDetails"]
                self.exceptions.append(
                    details.get("exception", {}).get("description") or details.get("text", "")
                )

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float = 15,
    ) -> dict[str, Any]:
        command_id = next(self._ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._answers[command_id] = send
        message: dict[str, Any] = {"id": command_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self._ws.send_message(json.dumps(message))
        with trio.fail_after(timeout):
            answer = await receive.receive()
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result


class Page:
    """One tab, attached with a flat session."""

    def __init__(self, cdp: Cdp, session: str) -> None:
        self.cdp = cdp
        self.session = session

    async def call(
        self, method: str, params: dict[str, Any] | None = None, timeout: float = 15
    ) -> dict[str, Any]:
        return await self.cdp.call(method, params, session=self.session, timeout=timeout)

    async def before_load(self, source: str) -> None:
        """Run ``source`` in every document before the page's own scripts."""
        await self.call("Page.addScriptToEvaluateOnNewDocument", {"source": source})

    async def goto(self, url: str, timeout: float = 15) -> None:
        """Navigate and return once the new document has loaded (its load event, so a wait
        never lands on the document being left)."""
        self.cdp.loaded = trio.Event()
        await self.call("Page.navigate", {"url": url})
        with trio.fail_after(timeout):
            await self.cdp.loaded.wait()

    async def evaluate(self, expression: str, timeout: float = 15) -> Any:
        result = await self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"{expression[:80]}: {text}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 10) -> Any:
        """Wait until ``expression`` is truthy in the page; re-checked on every DOM change, and
        in the new document when the page navigated meanwhile (a reload the test caused)."""
        deadline = trio.current_time() + timeout
        while True:
            left = max(0.1, deadline - trio.current_time())
            try:
                return await self.evaluate(_waiting_script(expression, left), timeout=left + 5)
            except CdpError as exc:
                if _NAVIGATED not in str(exc) or trio.current_time() >= deadline:
                    raise
                await trio.sleep(0.05)

    async def screenshot(self, path: Path) -> None:
        data = await self.call("Page.captureScreenshot", {"format": "png"})
        path.write_bytes(base64.b64decode(data["data"]))


@asynccontextmanager
async def chromium(
    executable: str,
    profile: Path,
    *,
    width: int = 1200,
    height: int = 760,
    extra_args: Sequence[str] = (),
) -> AsyncIterator[Page]:
    """Start headless Chromium, open one tab, and close everything on exit. ``extra_args``:
    more command-line switches (e.g. ``--host-resolver-rules=...``)."""
    argv = [
        executable,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--mute-audio",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        # the page speaks the browser's language: English unless a test asks for another
        *(() if any(a.startswith("--lang=") for a in extra_args) else ("--lang=en-US",)),
        *extra_args,
        "about:blank",
    ]
    async with trio.open_nursery() as nursery:
        # Chromium leaves org.chromium.Chromium.* folders in $TMPDIR: give it one of its own,
        # short (a socket's path inside it is limited to 107 bytes), removed afterwards
        scratch = Path(tempfile.mkdtemp(prefix="cdp-"))
        env = {**os.environ, "TMPDIR": str(scratch)}
        process = await trio.lowlevel.open_process(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
        )
        found: list[str] = []
        ready = trio.Event()

        async def drain() -> None:
            assert process.stderr is not None
            buffer = b""
            async for chunk in process.stderr:
                if ready.is_set():
                    continue
                buffer += chunk
                for line in buffer.split(b"\n"):
                    if line.startswith(b"DevTools listening on "):
                        found.append(line.split(b" ")[-1].decode().strip())
                        ready.set()
                buffer = buffer[-4096:]

        nursery.start_soon(drain)
        try:
            with trio.fail_after(30):
                await ready.wait()
            async with open_websocket_url(found[0], max_message_size=64 * 1024 * 1024) as ws:
                cdp = Cdp(ws)
                nursery.start_soon(cdp.reader)
                target = await cdp.call("Target.createTarget", {"url": "about:blank"})
                attached = await cdp.call(
                    "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
                )
                page = Page(cdp, attached["sessionId"])
                await page.call("Page.enable")
                await page.call("Runtime.enable")
                await page.call(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                )
                yield page
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                process.terminate()
                with trio.move_on_after(5):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                shutil.rmtree(scratch, ignore_errors=True)
