"""What every ``companion`` invocation promises: ``-V`` (through the installed command: the
version and the data layout), and
every command's log level from ``-v`` and ``--log-level``."""

from __future__ import annotations

from pathlib import Path

import companion
from companion.cli import build_parser
from companion.cli.options import chosen_log_level, log_level
from companion.store.layout import DATA_LAYOUT
from support.cli import run_companion


def test_dash_v_and_version_print_the_version_and_the_data_layout(tmp_path: Path) -> None:
    for flag in ("-V", "--version"):
        done = run_companion([flag], cwd=tmp_path, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"companion {companion.__version__} (data layout {DATA_LAYOUT})"


def test_run_log_level_is_warning_unless_asked() -> None:
    assert [log_level(None, n) for n in (0, 1, 2, 3)] == ["WARNING", "INFO", "DEBUG", "DEBUG"]
    assert log_level("error", 2) == "ERROR"  # a level by name wins


def test_every_command_takes_dash_v_one_level_at_a_time_and_a_level_by_name() -> None:
    assert [log_level(None, n, "INFO") for n in (0, 1, 2)] == ["INFO", "DEBUG", "DEBUG"]
    assert log_level(None, 1, "ERROR") == "WARNING"
    cases = {
        ("run", "pim"): "WARNING",
        ("demo",): "WARNING",
        ("bridge",): "INFO",
        ("relay",): "INFO",
        ("listen",): "WARNING",
        ("action", "run", "pim", "speak"): "ERROR",
    }
    for words, default in cases.items():
        parser = build_parser(words[0])
        assert chosen_log_level(parser.parse_args([*words])) == default, words
        louder = log_level(None, 1, default)
        assert chosen_log_level(parser.parse_args([*words, "-v"])) == louder, words
        assert chosen_log_level(parser.parse_args([*words, "-vv", "--log-level", "error"])) == "ERROR", words
