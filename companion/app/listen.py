"""What ``companion listen`` runs: the bridge client, the keyboard and the terminal screen.

Lines typed on standard input go to the listener (:func:`companion.listen.run_listener`), which
sends them to the bridge; what it shows is rendered by :class:`~companion.listen.terminal.TerminalScreen`
(a live status line on a terminal, plain lines otherwise). When the person types in the same
terminal the program reads keys itself (cbreak mode: no echo, no line editing by the terminal;
Ctrl-C still interrupts) so the line being typed stays whole below what arrives; the terminal's
settings are put back on exit.
"""

from __future__ import annotations

import codecs
import os
import shutil
import signal
import sys
import termios
import tty
from collections.abc import AsyncIterator, Callable

import trio

from companion.listen import ListenOptions, find_voice, run_listener
from companion.listen.terminal import LineEditor, TerminalScreen
from companion.listen.voice import PLAYERS

__all__ = ["listen_options", "run_terminal", "track_player"]


def track_player(player: str | None) -> tuple[str, ...] | None:
    """``--webrtc --voice``: where the bridge's audio track is played (raw mono PCM on stdin)."""
    if player:
        return tuple(player.split())
    for candidate in PLAYERS:
        if shutil.which(candidate[0]) is not None:
            return candidate
    print("companion listen: no audio player found; the voice is received, not played", file=sys.stderr)
    return None


def listen_options(
    *,
    url: str,
    user_id: str,
    token: str | None,
    voice: bool,
    player: str | None,
    speak: bool,
    webrtc: bool,
) -> ListenOptions:
    """The listener's options from the flags: ``voice`` speaks lines here through espeak-ng
    (or, with ``webrtc``, plays the bridge's voice); ``speak``: answer speak queries."""
    local_voice = None
    if voice and not webrtc:
        local_voice = find_voice(player.split() if player else None)
        if local_voice is None:
            print(
                "companion listen: espeak-ng is not installed; lines will be shown, not spoken",
                file=sys.stderr,
            )
    return ListenOptions(
        url=url,
        user_id=user_id,
        token=token,
        voice=local_voice,
        answer_speak=speak and not (webrtc and voice),
        webrtc=webrtc,
        rtc_voice=webrtc and voice,
        rtc_player=track_player(player) if webrtc and voice else None,
    )


def run_terminal(options: ListenOptions) -> int:
    """Run the listener on this terminal until the bridge or the keyboard ends it; its exit status."""
    typing = sys.stdin.isatty() and sys.stdout.isatty()
    saved = termios.tcgetattr(sys.stdin.fileno()) if typing else None
    try:
        if typing:
            tty.setcbreak(sys.stdin.fileno())
        return trio.run(_main, options, sys.stdout.isatty(), typing)
    finally:
        if saved is not None:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)


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


async def _read_keys(
    send: trio.MemorySendChannel[str], screen: TerminalScreen, write: Callable[[str], None]
) -> None:
    """Keys typed in the terminal (cbreak mode): the typed line drawn as it changes, each line
    sent on Enter; the channel closes on Ctrl-D on an empty line or the end of input."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    editor = LineEditor()
    write(screen.edit(""))
    async with send, trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
        while not editor.ended:
            data = await stdin.receive_some(4096)
            if not data:
                return
            if editor.feed(decoder.decode(data)):
                for line in editor.submitted:
                    write(screen.submitted(line))
                    await send.send(line)
                editor.submitted.clear()
                write(screen.edit(editor.text))


async def _main(options: ListenOptions, live: bool, typing: bool = False) -> int:
    """The listener and the keyboard; Ctrl-C (SIGINT) closes the connection and exits with 130.
    When it reads the keys itself, SIGTERM does the same (143), so the terminal's settings are
    put back (:func:`run_terminal`) rather than left without echo."""
    screen = TerminalScreen(live=live, color=live, width=_width, prompt=typing, timestamps=True)
    send, receive = trio.open_memory_channel[str](16)
    code, stopped_by = 1, list[int]()
    watched = (signal.SIGINT, signal.SIGTERM) if typing else (signal.SIGINT,)
    try:
        with trio.open_signal_receiver(*watched) as interrupts:
            async with trio.open_nursery() as nursery:
                if typing:
                    nursery.start_soon(_read_keys, send, screen, _write)
                else:
                    nursery.start_soon(_read_stdin, send)
                nursery.start_soon(_cancel_on_signal, interrupts, nursery.cancel_scope, stopped_by)
                code = await run_listener(options, receive, lambda item: _write(screen.render(item)))
                nursery.cancel_scope.cancel()
    finally:
        _write(screen.close())
    return 128 + stopped_by[0] if stopped_by else code


async def _cancel_on_signal(signals: AsyncIterator[int], scope: trio.CancelScope, seen: list[int]) -> None:
    async for signum in signals:
        seen.append(int(signum))
        scope.cancel()
        return
