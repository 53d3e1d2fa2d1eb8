"""What ``companion listen`` writes: the status line replaced in place in a terminal, a line
every few seconds when standard output is a file or a pipe, and no control characters."""

from __future__ import annotations

from companion.listen.core import Show
from companion.listen.terminal import CLEAR_LINE, TerminalScreen


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
