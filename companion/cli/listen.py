"""``companion listen``: follow the conversation in a terminal and take part in it.

Shows who speaks to whom (and with which emotion), sends what you type (to everyone, or
``@name``), answers ``speak`` queries (``--voice`` speaks them through espeak-ng and reports
them done when the audio has finished) and ``approval`` queries (y/n), and ``/next NAME``
nominates the next speaker. While a companion prepares its reply, a status line counts the
seconds (``Juniper is thinking… (12 s)``); a companion that cannot reply is one line with the
reason; the end of a conversation is marked.
"""

from __future__ import annotations

import argparse
import codecs
import getpass
import os
import re
import shutil
import sys
from typing import Any

import trio

from ..listen import ListenOptions, find_voice, run_listener
from ..listen.terminal import TerminalScreen
from ..listen.voice import PLAYERS
from ..log import configure_logging
from .bridge import TOKEN_ENV

__all__ = ["default_user_id", "register"]


def default_user_id() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = "me"
    return "user_" + (re.sub(r"[^A-Za-z0-9_]", "_", name) or "me")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "listen",
        help="follow the conversation in a terminal and take part",
        description="Connect to a bridge, show the conversation live and send what you type. "
        "Type /help once connected for the commands.",
    )
    parser.add_argument(
        "--ws", default="ws://127.0.0.1:8080/", metavar="URL", help="the bridge's WebSocket URL"
    )
    parser.add_argument(
        "--as",
        dest="user_id",
        default=None,
        metavar="user_NAME",
        help=f"your id in the conversation (default {default_user_id()})",
    )
    parser.add_argument("--token", default=None, help=f"the bridge's token (default ${TOKEN_ENV})")
    parser.add_argument(
        "--voice", action="store_true", help="speak companions' lines through espeak-ng before answering"
    )
    parser.add_argument(
        "--player",
        default=None,
        metavar="COMMAND",
        help="audio player reading raw 16-bit mono PCM on stdin, with {rate} for the sample rate "
        "(default: the first of aplay, paplay, pw-play, play; else espeak-ng plays itself)",
    )
    parser.add_argument(
        "--no-speak", action="store_true", help="leave speak queries to other clients (do not answer them)"
    )
    parser.add_argument(
        "--webrtc",
        action="store_true",
        help="connect over WebRTC (a data channel); with --voice the bridge speaks the lines and "
        "this terminal plays its audio track through the player",
    )
    parser.add_argument("--log-level", default="WARNING")
    parser.set_defaults(func=main)


def _track_player(player: str | None) -> tuple[str, ...] | None:
    """``--webrtc --voice``: where the bridge's audio track is played (raw mono PCM on stdin)."""
    if player:
        return tuple(player.split())
    for candidate in PLAYERS:
        if shutil.which(candidate[0]) is not None:
            return candidate
    print("companion listen: no audio player found; the voice is received, not played", file=sys.stderr)
    return None


def _width() -> int:
    return shutil.get_terminal_size().columns


def _write(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


async def _read_stdin(send: trio.MemorySendChannel[str]) -> None:
    """Lines typed by the person; the channel closes at end of input."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = ""
    async with send, trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
        while True:
            data = await stdin.receive_some(4096)
            pending += decoder.decode(data, final=not data)
            *lines, pending = pending.split("\n")
            for line in lines:
                await send.send(line)
            if not data:
                if pending:
                    await send.send(pending)
                return


async def _main(options: ListenOptions, tty: bool) -> int:
    screen = TerminalScreen(live=tty, color=tty, width=_width)
    send, receive = trio.open_memory_channel[str](16)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_stdin, send)
            code = await run_listener(options, receive, lambda item: _write(screen.render(item)))
            nursery.cancel_scope.cancel()
    finally:
        _write(screen.close())
    return code


def main(args: argparse.Namespace) -> int:
    user_id = args.user_id or default_user_id()
    if not user_id.startswith("user_") or user_id == "user_":
        print(f"companion listen: --as must look like user_NAME, not {user_id!r}", file=sys.stderr)
        return 2
    configure_logging(args.log_level.upper())
    voice = None
    if args.voice and not args.webrtc:
        voice = find_voice(args.player.split() if args.player else None)
        if voice is None:
            print(
                "companion listen: espeak-ng is not installed; lines will be shown, not spoken",
                file=sys.stderr,
            )
    options = ListenOptions(
        url=args.ws,
        user_id=user_id,
        token=args.token or os.environ.get(TOKEN_ENV) or None,
        voice=voice,
        answer_speak=not args.no_speak and not (args.webrtc and args.voice),
        webrtc=args.webrtc,
        rtc_voice=args.webrtc and args.voice,
        rtc_player=_track_player(args.player) if args.webrtc and args.voice else None,
    )
    try:
        return trio.run(_main, options, sys.stdout.isatty())
    except KeyboardInterrupt:
        return 130
