"""The silent gap between two companions' lines: one companion's ``message.send`` -> the next
companion's first ``speak`` query, with the next turn started while the line is still voiced
(pipelined) and without (``companion run --no-pipeline``, the reference, measured in the same run).

One ``companion run --ws --no-webrtc`` process with two companions whose cards speak through
``speak_with_voice``, their model the fake OpenAI-compatible server of
``tests/support/fake_llm_server.py`` streaming at a profile's time to first token and token rate
(hosted: 0.4 s and 60 tokens/s; local: 2 s and 20 tokens/s). A WebSocket client asks the two
companions, naming one, and says each sentence it is asked to voice in ``--per-char`` seconds a
character (0.06 s: about a person's speaking rate), so a line is heard for a few seconds after its
text is complete: the time the pipelined next turn works in. Each round is one conversation, which
the companions close by themselves (``max_turns``); every pair of lines by two different companions
gives one gap. The first round of each mode warms up and is not counted.

    python scripts/bench_pipeline.py                          # hosted and local, 3 rounds each
    python scripts/bench_pipeline.py --profile hosted --rounds 5
    python scripts/bench_pipeline.py --profile smollm2 --llama-venv VENV [--reads-param]

``smollm2``: both companions on SmolLM2-135M behind one llama-cpp-python server (started per
mode, ``--cache true``; ``bench_latency``'s), each round asking its own question. That server
answers one request at a time: what the pipelined turn asks while a line is heard waits for
nobody, since nothing else of the conversation asks the server then.

Every wait has a deadline; every process and server is stopped by its PID however the run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio
from trio_websocket import WebSocketConnection, open_websocket_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the support package

from bench_latency import MODEL, QUESTIONS, Companion, llama_server, voice_card  # noqa: E402
from bench_support import percentile  # noqa: E402

from support.cards import write_card  # noqa: E402
from support.fake_llm_server import running_server  # noqa: E402
from support.voice import VoiceModel, ask_over_ws  # noqa: E402

PROFILES: dict[str, tuple[float, float]] = {"hosted": (0.4, 60.0), "local": (2.0, 20.0)}
NAMES = {"companion_juniper": "Juniper", "companion_pim": "Pim"}
MAX_TURNS = 4
ASKED = "Juniper, what did you see at the harbour? Tell Pim too."
_ADJ = [
    "amber",
    "brisk",
    "cobalt",
    "dusty",
    "early",
    "faded",
    "gentle",
    "hollow",
    "icy",
    "jagged",
    "kindly",
    "lonely",
    "misty",
    "narrow",
]
_NOUN = [
    "anchor",
    "barrel",
    "cannon",
    "donkey",
    "engine",
    "falcon",
    "garden",
    "harbour",
    "island",
    "jetty",
    "kettle",
    "lantern",
]
_VERB = [
    "rested",
    "waited",
    "drifted",
    "leaned",
    "glowed",
    "rattled",
    "shivered",
    "wandered",
    "hummed",
    "tumbled",
    "swayed",
]
_PLACE = [
    "mill",
    "quay",
    "bridge",
    "chapel",
    "tower",
    "market",
    "orchard",
    "meadow",
    "station",
    "ferry",
    "cellar",
    "pier",
    "bakery",
]


def line(n: int) -> str:
    """The ``n``-th line said: three sentences, each its own words (a companion never says a
    sentence twice, ``companion.lines.check``)."""

    def sentence(k: int) -> str:
        return (
            f"The {_ADJ[k % len(_ADJ)]} {_NOUN[(k * 5) % len(_NOUN)]} "
            f"{_VERB[(k * 7) % len(_VERB)]} by the {_PLACE[(k * 3) % len(_PLACE)]}."
        )

    k = 3 * n + 2
    place = _PLACE[(k * 3) % len(_PLACE)]
    ask = f"Was the {_ADJ[k % len(_ADJ)]} {_NOUN[(k * 5) % len(_NOUN)]} near the {place}?"
    return f"{sentence(3 * n)} {sentence(3 * n + 1)} {ask}"


class Home(Companion):
    """``companion run`` with both cards (``bench_latency``'s process, its log collected)."""

    def __init__(
        self,
        tmp: Path,
        base_url: str,
        pipeline: bool,
        model: str = "openai:fake-1",
        reads_param: bool = False,
    ) -> None:
        cards = []
        for cid, name in NAMES.items():
            text = voice_card(cid.removeprefix("companion_"), name, reads_param)
            cards.append(write_card(tmp, name.lower(), f"{text}settings:\n  max_turns: {MAX_TURNS}\n"))
        argv = [sys.executable, "-m", "companion.cli.run", *map(str, cards), "--no-mdns"]
        argv += ["--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(tmp / "data"), "--log-format", "json"]
        argv += ["-v", "--ws", "127.0.0.1:0", "--no-webrtc", "--model", model]
        argv += ["--base-url", base_url]
        argv += [] if pipeline else ["--no-pipeline"]
        self._start(argv)

    def count(self, kind: str) -> int:
        return sum(e.get("event") == kind for e in self.events_since(0))


async def conversation(
    url: str, index: int, per_char: float, timeout: float, asked: str = ASKED
) -> list[float]:
    """One conversation; the gaps (seconds) from each companion line to the next companion's
    first ``speak`` query, when the next line is another companion's."""
    gaps: list[float] = []
    last: tuple[str, float] | None = None  # the last line's speaker and when it came
    waiting_first = False

    async def say(ws: WebSocketConnection, query: Any) -> None:
        await trio.sleep(per_char * len(str(query["params"]["body"].get("message", ""))))
        answer = {"jsonrpc": "2.0", "id": query["id"], "result": {"success": True, "body": {}}}
        await ws.send_message(json.dumps({"topic": "queries", "body": answer}))

    async with open_websocket_url(f"{url}?topics=messages,queries,states") as ws:
        with trio.fail_after(timeout):
            text: str | None = await ask_over_ws(ws, asked, f"bench-{index}", list(NAMES))
            async with trio.open_nursery() as nursery:
                while True:
                    got = json.loads(text if text is not None else await ws.get_message())
                    text = None
                    now = trio.current_time()
                    if isinstance(got, list):
                        if got and all(s.get("params", {}).get("closing") == "terminal" for s in got):
                            nursery.cancel_scope.cancel()
                            break
                    elif got.get("method") == "query.send" and got["params"]["type"] == "speak":
                        speaker = got["params"]["from"]
                        if waiting_first and last is not None and speaker != last[0]:
                            gaps.append(now - last[1])
                        waiting_first = False
                        nursery.start_soon(say, ws, got)
                    elif got.get("method") == "message.send" and got["params"]["from"] in NAMES:
                        last, waiting_first = (got["params"]["from"], now), True
    return gaps


def run_mode(
    profile: str,
    pipeline: bool,
    rounds: int,
    per_char: float,
    timeout: float,
    venv: Path | None = None,
    reads_param: bool = False,
) -> tuple[list[float], int, int]:
    """The gaps of ``rounds`` conversations (after one warm-up), the states answers and the
    prepared replies taken from previews."""
    gaps: list[float] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pipeline-")))
        if profile == "smollm2":
            assert venv is not None
            home = Home(tmp, stack.enter_context(llama_server(venv)).url, pipeline, MODEL, reads_param)
        else:
            ttft, rate = PROFILES[profile]
            server = stack.enter_context(running_server(ttft=ttft, token_rate=rate))
            server.push(*([VoiceModel(say=line)] * 400))
            home = Home(tmp, server.openai_base_url, pipeline, reads_param=reads_param)
        try:
            url = home.url()
            for index in range(rounds + 1):
                asked = QUESTIONS[index % len(QUESTIONS)] if profile == "smollm2" else ASKED
                found = trio.run(conversation, url, index, per_char, timeout, asked)
                if index:
                    gaps += found
            adopted = home.count("states_ahead_adopted")
            prepared = home.count("reply_prepared_adopted")
            refused = home.count("line_refused")
        finally:
            home.stop()
    if refused:
        print(f"({refused} lines refused by the line check in this mode)", flush=True)
    return gaps, adopted, prepared


def _row(name: str, gaps: list[float], adopted: int, prepared: int) -> str:
    if not gaps:
        return f"| {name} | 0 | – | – | {adopted} | {prepared} |"
    p50 = statistics.median(gaps)
    return (
        f"| {name} | {len(gaps)} | {p50:.2f} | {min(gaps):.2f}–{max(gaps):.2f} "
        f"(p90 {percentile(gaps, 0.9):.2f}) | {adopted} | {prepared} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profile", action="append", choices=[*sorted(PROFILES), "smollm2"], help="default: hosted and local"
    )
    parser.add_argument("--llama-venv", type=Path, help="smollm2: a virtualenv with llama-cpp-python[server]")
    parser.add_argument("--reads-param", action="store_true", help="cards whose condition reads mood")
    parser.add_argument("--rounds", type=int, default=3, help="conversations per mode, after a warm-up")
    parser.add_argument("--per-char", type=float, default=0.06, help="seconds the client says a character in")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one conversation may take")
    args = parser.parse_args(argv)
    if "smollm2" in (args.profile or []) and args.llama_venv is None:
        parser.error("--profile smollm2 needs --llama-venv VENV")
    for profile in args.profile or ["hosted", "local"]:
        if profile == "smollm2":
            source = "SmolLM2-135M behind llama-cpp-python (--cache true)"
        else:
            ttft, rate = PROFILES[profile]
            source = f"time to first token {ttft:g} s, {rate:g} tokens/s"
        card = "; a condition reads mood" if args.reads_param else ""
        print(f"\n{profile}: {source}; voice {args.per_char:g} s/char{card}")
        columns = "states answers taken from previews | prepared replies adopted"
        print(f"| mode | gaps | p50 s | min–max s | {columns} |")
        print("|---|---|---|---|---|---|")
        for pipeline in (False, True):
            gaps, adopted, prepared = run_mode(
                profile, pipeline, args.rounds, args.per_char, args.timeout, args.llama_venv, args.reads_param
            )
            name = "pipelined" if pipeline else "reference (--no-pipeline)"
            print(_row(name, gaps, adopted, prepared), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
