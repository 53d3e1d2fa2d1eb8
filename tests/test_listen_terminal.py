"""What ``companion listen`` writes: the status line replaced in place in a terminal, a line
every few seconds when standard output is a file or a pipe, and no control characters."""

from __future__ import annotations

import time

from companion.listen.core import Show
from companion.listen.terminal import CLEAR_LINE, CURSOR_UP, MAX_INPUT, LineEditor, TerminalScreen, columns


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def status(text: str) -> Show:
    return Show(text, "status")


def test_in_a_terminal_the_status_line_is_replaced_in_place() -> None:
    screen = TerminalScreen(live=True, color=False, width=lambda: 80)
    assert screen.render(Show("hello", "message")) == "hello\n"
    # drawn without a newline, so the next draw replaces it
    assert screen.render(status("Juniper is thinking… (0 s)")) == CLEAR_LINE + "Juniper is thinking… (0 s)"
    assert screen.render(status("Juniper is thinking… (1 s)")) == CLEAR_LINE + "Juniper is thinking… (1 s)"
    # a line printed meanwhile takes the status line's place; the status follows below it
    assert screen.render(Show("* Pim: wave {}", "action")) == (
        CLEAR_LINE + "* Pim: wave {}\n" + "Juniper is thinking… (1 s)"
    )
    assert screen.render(status("")) == CLEAR_LINE  # cleared
    assert screen.render(status("")) == ""
    assert screen.render(Show("Juniper → you: Hi.", "message")) == "Juniper → you: Hi.\n"
    assert screen.close() == ""


def test_a_status_wider_than_the_terminal_is_cut_so_it_never_wraps() -> None:
    screen = TerminalScreen(live=True, color=False, width=lambda: 20)
    drawn = screen.render(status("Juniper is thinking… (3 s) · Pim is thinking… (1 s)"))
    assert drawn == CLEAR_LINE + "Juniper is thinkin…" and len(drawn) - len(CLEAR_LINE) == 19
    assert screen.close() == CLEAR_LINE


def test_colors_only_when_asked() -> None:
    screen = TerminalScreen(live=True, color=True)
    assert (
        screen.render(status("Pim is thinking… (0 s)")) == CLEAR_LINE + "\033[2mPim is thinking… (0 s)\033[0m"
    )
    assert screen.render(Show("failed", "error")) == (
        CLEAR_LINE + "\033[31mfailed\033[0m\n" + "\033[2mPim is thinking… (0 s)\033[0m"
    )


def test_not_a_terminal_the_status_is_a_line_now_and_then() -> None:
    clock = Clock()
    screen = TerminalScreen(live=False, color=False, clock=clock)
    out = []
    for second in range(13):
        clock.now = 100.0 + second + 0.01 * (second % 3)  # ticks come about once a second
        out.append(screen.render(status(f"Juniper is thinking… ({second} s)")))
    assert "".join(out) == (
        "Juniper is thinking… (0 s)\nJuniper is thinking… (5 s)\nJuniper is thinking… (10 s)\n"
    )
    assert screen.render(status("")) == ""
    assert screen.render(Show("Juniper could not answer: ...", "error")) == "Juniper could not answer: ...\n"
    clock.now += 1
    # the next speaker's thinking is written at once
    assert screen.render(status("Pim is thinking… (0 s)")) == "Pim is thinking… (0 s)\n"
    assert CLEAR_LINE not in "".join(out) and screen.close() == ""


def test_control_characters_never_reach_the_terminal() -> None:
    screen = TerminalScreen(live=True, color=False)
    line = screen.render(Show("Pim → you: \x1b[2J\x1b]0;pwned\x07two\nlines\tok \u202ertl \ud800", "message"))
    assert line == "Pim → you: [2J]0;pwnedtwo\nlines\tok rtl \ufffd\n"
    assert screen.render(status("a\x1b[1Ab")) == CLEAR_LINE + "a[1Ab"


def test_the_typed_line_stays_last_and_whole_while_lines_arrive() -> None:
    screen = TerminalScreen(live=True, color=False, width=lambda: 40, prompt=True)
    assert screen.edit("hello wor") == "> hello wor"
    # a line arrives: printed above, the typed line drawn again as it was
    assert screen.render(Show("Pim → you: Hi!", "message")) == CLEAR_LINE + "Pim → you: Hi!\n> hello wor"
    # the status sits between the lines and the typed row; both rows are cleared and redrawn
    assert (
        screen.render(status("Pim is thinking… (0 s)")) == CLEAR_LINE + "Pim is thinking… (0 s)\n> hello wor"
    )
    assert screen.render(Show("Aya → you: Yes.", "message")) == (
        CLEAR_LINE + CURSOR_UP + CLEAR_LINE + "Aya → you: Yes.\n" + "Pim is thinking… (0 s)\n> hello wor"
    )
    assert (
        screen.edit("hello world")
        == CLEAR_LINE + CURSOR_UP + CLEAR_LINE + "Pim is thinking… (0 s)\n> hello world"
    )
    # Enter: the line stays in the log, the typed row starts again empty
    assert screen.submitted("hello world").endswith("> hello world\nPim is thinking… (0 s)\n> ")
    assert screen.close() == CLEAR_LINE + CURSOR_UP + CLEAR_LINE


def test_a_long_or_wide_typed_line_shows_its_end_within_the_width() -> None:
    screen = TerminalScreen(live=True, color=False, width=lambda: 21, prompt=True)
    drawn = screen.edit("こんにちは、今日はいい天気ですね")
    shown = drawn.removeprefix(CLEAR_LINE)
    assert shown.startswith("> …") and shown.endswith("天気ですね") and columns(shown) <= 20
    assert columns("天気") == 4 and columns("e\u0301") == 1


def test_timestamps_start_message_lines() -> None:
    screen = TerminalScreen(live=False, color=False, timestamps=True, wall=lambda: 0.0)
    said = time.mktime((2026, 12, 5, 9, 7, 0, 0, 0, -1))
    assert screen.render(Show("Pim → you: Hi", "message", said)) == "09:07 Pim → you: Hi\n"
    assert screen.render(Show("(info)")) == "(info)\n"


def test_the_line_editor() -> None:
    editor = LineEditor()
    assert editor.feed("hel") and editor.text == "hel"
    editor.feed("lo\x7f\x7fp me\x1b[D\x1bOA")  # Backspaces; the arrow keys' sequences are dropped
    assert editor.text == "help me"
    editor.feed("\x17")  # Ctrl-W: the last word
    assert editor.text == "help "
    editor.feed("\x15日本語\x01\r")  # Ctrl-U clears; other control characters are dropped
    assert editor.submitted == ["日本語"] and editor.text == ""
    editor.feed("x\x04")
    assert not editor.ended  # Ctrl-D ends only an empty line
    editor.feed("\x7f\x04")
    assert editor.ended
    editor.feed("a" * (MAX_INPUT + 10))
    assert len(editor.text) == MAX_INPUT
