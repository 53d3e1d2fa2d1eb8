"""What every ``companion`` invocation promises: ``-V`` (through the installed command), and
``companion run``'s log level from ``-v``."""

from __future__ import annotations

from pathlib import Path

from cli_support import run_companion

import companion
from companion.cli.run import log_level


def test_dash_v_and_version_print_the_version(tmp_path: Path) -> None:
    for flag in ("-V", "--version"):
        done = run_companion([flag], cwd=tmp_path, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"companion {companion.__version__}"


def test_run_log_level_is_warning_unless_asked() -> None:
    assert [log_level(None, n) for n in (0, 1, 2, 3)] == ["WARNING", "INFO", "DEBUG", "DEBUG"]
    assert log_level("error", 2) == "ERROR"  # a level by name wins
