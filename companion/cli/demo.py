"""``companion demo``: watch three companions talk (offline by default), or any cards you name.

What runs is :mod:`companion.app.demo`; this module parses the arguments and prints the transcript.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from companion.app.logs import configure_node_logging
from companion.app.stopping import is_interrupt
from companion.cli.options import add_log_level_arguments, chosen_log_level
from companion.log import configure_logging
from companion.tasks import innermost

if TYPE_CHECKING:
    from companion.app.spawner import Spawner

__all__ = ["main", "register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="watch companions talk: three processes on 127.0.0.1, scripted model by default",
        description=(
            "Start the companions of CARD files (default: the first three in cards/) as separate "
            "processes on 127.0.0.1, send an opening line, and print the conversation until it "
            "reaches terminal or the turn cap. Exit status 0 when it ends either way."
        ),
    )
    parser.add_argument(
        "cards",
        nargs="*",
        type=Path,
        metavar="CARD",
        help="card files or names of shipped cards (default: ./cards/, else the shipped pim, ostra, juniper)",
    )
    parser.add_argument(
        "--model",
        default="scripted",
        help="model for every companion: scripted (offline, default), openai:NAME, anthropic:NAME",
    )
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (Ollama, vLLM...)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the scripted model (default 0)")
    parser.add_argument("--max-turns", type=int, default=30, help="stop after this many replies (default 30)")
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="give up after this many seconds (default 180)"
    )
    parser.add_argument("--pace", type=float, default=0.5, help="seconds a speaker pauses before a reply")
    parser.add_argument("--say", default=None, metavar="TEXT", help="the opening line")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
    parser.add_argument(
        "--in-memory", action="store_true", help="run everything in this process (no sockets)"
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help=(
            "keep the companions' logs and data here (otherwise they go to a temporary folder,"
            " removed when the demo finishes and kept when it fails)"
        ),
    )
    add_log_level_arguments(parser, "WARNING", "this process's events (the companions log to their files)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from companion.app.spawner import Spawner, preload_for

    configure = configure_logging if args.in_memory else configure_node_logging  # py-libp2p's too
    configure(chosen_log_level(args), "json" if args.json else "text")
    # before anything starts a thread or an event loop (the model's check does): the companions'
    # imports start now, beside this process's (companion/app/spawner.py)
    spawner = None if args.in_memory else Spawner.fork(preload_for(args.model))
    try:
        return _demo(args, spawner)
    finally:
        if spawner is not None:
            spawner.close()


def _demo(args: argparse.Namespace, spawner: Spawner | None) -> int:
    """The demo once its spawner (if any) runs: checks, then the conversation."""
    from companion.app.cards import resolve_card
    from companion.app.demo import FINISHED, DemoOptions, check_demo_model, default_cards, names_of, run_demo
    from companion.card.model import CardError, load_card
    from companion.conversation.transcript import TranscriptEvent, render_text
    from companion.models.errors import ModelSetupError

    try:  # a missing key or an unreachable endpoint is reported now, not mid-conversation
        check_demo_model(args.model, args.base_url)
    except ModelSetupError as exc:
        print(f"companion demo: {exc}", file=sys.stderr)
        return 2
    try:
        cards = [resolve_card(card) for card in args.cards] or default_cards()
        loaded = [load_card(path) for path in cards]
    except (CardError, FileNotFoundError) as exc:
        print(f"companion demo: {exc}", file=sys.stderr)
        return 2
    names = names_of(loaded)
    first: dict[str, Path] = {}
    for path, card in zip(cards, loaded, strict=True):
        cid = card.card.metadata.id
        if cid in first:  # its second process would find the first's data directory locked
            print(
                f"companion demo: {first[cid]} and {path} are the same companion ({cid}), which runs "
                "once: name another card",
                file=sys.stderr,
            )
            return 2
        first[cid] = path
    options = DemoOptions(
        cards=cards,
        model=args.model,
        base_url=args.base_url,
        seed=args.seed,
        max_replies=args.max_turns,
        timeout=args.timeout,
        pace=args.pace,
        text=args.say,
        in_memory=args.in_memory,
        keep_dir=args.keep,
    )

    reader_gone = False

    def emit(event: TranscriptEvent) -> None:
        nonlocal reader_gone
        text = json.dumps(event.to_json(), ensure_ascii=False) if args.json else render_text(event, names)
        if text is None or reader_gone:
            return
        try:
            print(text, flush=True)
        except BrokenPipeError:
            # The reader went away (`companion demo --json | head`): stop as on Ctrl-C, the
            # companions with it, and say nothing more on a pipe nobody reads.
            reader_gone = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            os.kill(os.getpid(), signal.SIGINT)

    if not args.json:
        cast = [name for cid, name in names.items() if cid.startswith("companion_")]
        print(f"companion demo: {', '.join(cast)} ({args.model})", flush=True)
    try:
        end = trio.run(run_demo, options, emit, spawner)
    except BaseException as exc:
        if is_interrupt(exc):
            return 0 if reader_gone else 130
        failure = innermost(exc)  # raised inside the demo's nursery: in a group of one
        if isinstance(failure, TimeoutError | RuntimeError):
            print(f"companion demo: {failure}", file=sys.stderr)
            return 1
        raise
    return 0 if end.reason in FINISHED else 1
