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
import getpass
import os
import re
import sys
from typing import Any

from companion.cli.options import TOKEN_ENV, add_log_level_arguments, chosen_log_level
from companion.log import configure_logging
from companion.protocol import USER_ID_PREFIX

__all__ = ["default_user_id", "register"]


def default_user_id() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = "me"
    return USER_ID_PREFIX + (re.sub(r"[^A-Za-z0-9_]", "_", name) or "me")


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
    add_log_level_arguments(parser, "WARNING", "the connection's events")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from companion.app.listen import listen_options, run_terminal

    user_id = args.user_id or default_user_id()
    if not user_id.startswith(USER_ID_PREFIX) or user_id == USER_ID_PREFIX:
        print(f"companion listen: --as must look like user_NAME, not {user_id!r}", file=sys.stderr)
        return 2
    configure_logging(chosen_log_level(args))
    options = listen_options(
        url=args.ws,
        user_id=user_id,
        token=args.token or os.environ.get(TOKEN_ENV) or None,
        voice=args.voice,
        player=args.player,
        speak=not args.no_speak,
        webrtc=args.webrtc,
    )
    try:
        return run_terminal(options)
    except KeyboardInterrupt:
        return 130
