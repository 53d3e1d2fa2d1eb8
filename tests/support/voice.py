"""Voice over a live companion: a fake model whose lines are voiced a sentence at a time,
Juniper on it behind a bridge, and a client that asks and reads what comes back."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Final

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from support.cards import speaking_card, write_card
from support.fake_llm_server import CooperativeModel, FakeLLMServer, Reply, addressees, tool_call
from support.live import bridge_url, start_run
from support.live_bridge import blocking, message_frame
from support.network import Network, Proc, network

LINES = (
    "The sea is calm tonight. I saw three boats, Dr. Ahn said 2.5 knots! Shall we sail?",
    "Fog rolls in slowly now. Mr. Vale logged 4.2 metres of swell off the point! Hear the bell?",
    "My lamp burns late again. Mrs. Ode counted 7.5 hours of rain! Will it clear by dawn?",
    "Gulls circle the pier. St. Anne's tower chimed at 6.15 sharp! Can you see it?",
    "Waves break on black rocks. Capt. Rook sailed 12.5 miles before noon! Was he brave?",
    "Stars fill the northern sky. Prof. Lin measured 0.3 degrees of drift! Does it matter?",
    "The tide turns at midnight. Dr. Saito swam 1.5 laps in the cove! Who goes next?",
    "Salt dries on my coat. Mr. Ibsen painted 3.5 metres of hull blue! Is it finished?",
)
"""Every line the model says, one per ``speak`` call in turn: each its own, since a companion
never says a line twice (``companion.lines.check``); each with an abbreviation and a decimal that must
not end a sentence."""


LINE = LINES[0]


CUT = 14
"""Tokens after which the cut answer breaks off: inside the line's second sentence."""


class VoiceModel(CooperativeModel):
    """States and parameters as :class:`CooperativeModel`; the ``n``-th line is ``LINES[n - 1]``
    through ``speak_with_voice``, and the answers listed in ``cut`` (by speak request, from 1)
    break off."""

    def __init__(self, cut: set[int] | None = None, say: Callable[[int], str] | None = None) -> None:
        """``say(n)``: the ``n``-th line (from 1), instead of :data:`LINES` in turn."""
        super().__init__()
        self.cut = cut or set()
        self.say = say
        self.speaks = 0

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        if "speak_with_voice" not in tools:
            return super().__call__(body)
        self.speaks += 1
        users = [str(m.get("content")) for m in body["messages"] if m.get("role") == "user"]
        user = users[-1] if users else ""  # the last user turn: the task
        to = addressees(user)
        line = self.say(self.speaks) if self.say else LINES[(self.speaks - 1) % len(LINES)]
        reply = tool_call("speak_with_voice", {"message": line, "to": to, "emotion": "happy"})
        if self.speaks in self.cut:
            return Reply(calls=reply.calls, cut_after=CUT)
        return reply


CLOSED: Final = "<the bridge closed>"
"""``frames_until(..., until=CLOSED)``: read until the bridge closes the connection (a stop)."""


async def frames_until(
    ws: WebSocketConnection,
    answer: bool,
    until: str | None,
    timeout: float,
    first: str | None = None,
    speaking: float = 0.0,
    on_query: Callable[[list[Any]], None] | None = None,
) -> list[Any]:
    """Every frame until a ``message.send`` from ``until`` (any companion: ``None``; none, the
    bridge closing the connection: :data:`CLOSED`); ``speak`` queries answered after ``speaking``
    seconds (the time to say the sentence) when ``answer``, never otherwise, and ``on_query``
    called with the frames so far at each. ``first``: a frame already read. Each frame gets
    ``_at`` (when it came) and each answer is recorded as a frame ``{"_answered": id, "_at"}``."""
    frames: list[Any] = []

    async def say(query: Any) -> None:
        await trio.sleep(speaking)  # an aikyo client says the sentence, then answers
        result = {"jsonrpc": "2.0", "id": query["id"], "result": {"success": True, "body": {}}}
        with contextlib.suppress(ConnectionClosed):  # the bridge closed while it was said
            await ws.send_message(json.dumps({"topic": "queries", "body": result}))
            frames.append({"_answered": query["id"], "_at": trio.current_time()})

    with trio.fail_after(timeout):
        async with trio.open_nursery() as nursery:  # reading goes on while a sentence is said
            while True:
                try:
                    frame = json.loads(first if first is not None else await ws.get_message())
                except ConnectionClosed:
                    if until != CLOSED:
                        raise
                    nursery.cancel_scope.cancel()  # nobody is left to answer
                    return frames
                first = None
                frame["_at"] = trio.current_time()
                frames.append(frame)
                if frame.get("method") == "query.send":
                    if on_query is not None:
                        on_query(frames)
                    if answer:
                        nursery.start_soon(say, frame)
                sender = (
                    frame.get("params", {}).get("from", "") if frame.get("method") == "message.send" else ""
                )
                if sender.startswith("companion_") and until in (None, sender):
                    return frames
    raise AssertionError("unreachable")


def assert_one_voice(frames: list[Any]) -> None:
    """Never two companions voiced at once: a sentence query only from the companion whose line
    is being voiced, until its ``message.send``."""
    speaking: str | None = None
    for frame in frames:
        if frame.get("method") == "query.send":
            assert speaking in (None, frame["params"]["from"]), "two companions voiced at once"
            speaking = frame["params"]["from"]
        elif frame.get("method") == "message.send" and frame["params"]["from"] == speaking:
            speaking = None


def speak_queries(frames: list[Any]) -> list[Any]:
    return [f for f in frames if f.get("method") == "query.send" and f["params"]["type"] == "speak"]


async def ask_over_ws(ws: WebSocketConnection, text: str, msg_id: str, to: list[str]) -> str:
    """Send the message (again, same id, until something comes back: the clients' node joins the
    gossip mesh on a heartbeat); returns the first frame received."""
    for _attempt in range(10):
        await ws.send_message(message_frame("user_mika", to, text, msg_id))
        with trio.move_on_after(3):
            return str(await ws.get_message())
    raise AssertionError("nothing came back to the client's message")


PAIR: Final = (("juniper", "Juniper"), ("pim", "Pim"))
"""The companions of :func:`pair_home`, each ``(key, name)``."""

TRIO: Final = (*PAIR, ("ostra", "Ostra"))
"""Three companions for :func:`voice_home`: with three, a message addresses two companions, so the
next leader's states call is made beside the next speaker's prepared reply."""


@contextlib.asynccontextmanager
async def voice_home(
    tmp_path: Path,
    server: FakeLLMServer,
    companions: tuple[tuple[str, str], ...],
    *extra: str,
    reads_param: bool = False,
) -> AsyncIterator[tuple[Network, Proc, str]]:
    """``companion run --ws`` with ``companions`` (each ``(key, name)``, all ``speak_with_voice``,
    their cards reading a parameter when ``reads_param``) on ``server``'s model, ``extra``
    arguments added: the network, the process and the bridge's URL."""
    cards = [
        write_card(tmp_path, key, speaking_card(key, name, "speak_with_voice", reads_param=reads_param))
        for key, name in companions
    ]
    args = ("--ws", "127.0.0.1:0", "--no-webrtc", *extra, "--model", "openai:fake-1", "--base-url")
    with network(tmp_path) as net:
        home = await blocking(start_run, net, "home", cards, extra=(*args, server.openai_base_url))
        yield net, home, await blocking(bridge_url, home)


@contextlib.asynccontextmanager
async def pair_home(
    tmp_path: Path, server: FakeLLMServer, *extra: str, reads_param: bool = False
) -> AsyncIterator[tuple[Network, Proc, str]]:
    """:func:`voice_home` with Juniper and Pim (:data:`PAIR`)."""
    async with voice_home(tmp_path, server, PAIR, *extra, reads_param=reads_param) as home:
        yield home


@contextlib.asynccontextmanager
async def juniper_home(
    tmp_path: Path, server: FakeLLMServer | None, *, model: tuple[str, str] | None = None
) -> AsyncIterator[tuple[Network, Proc, str]]:
    """``companion run --ws`` with Juniper (``speak_with_voice``) on ``server``'s model, or on
    ``model`` (its spec and base URL: a real server): the network, the process and the bridge's
    URL."""
    card = write_card(tmp_path, "juniper", speaking_card("juniper", "Juniper", "speak_with_voice"))
    if model is None:
        assert server is not None
        model = ("openai:fake-1", server.openai_base_url)
    args = ("--ws", "127.0.0.1:0", "--no-webrtc", "--model", model[0], "--base-url", model[1])
    with network(tmp_path) as net:
        home = await blocking(start_run, net, "home", [card], extra=args)
        yield net, home, await blocking(bridge_url, home)
