"""What every ``companion`` invocation promises, through the installed command: ``-V``."""

from __future__ import annotations

from pathlib import Path

from cli_support import run_companion

import companion


def test_dash_v_and_version_print_the_version(tmp_path: Path) -> None:
    for flag in ("-V", "--version"):
        done = run_companion([flag], cwd=tmp_path, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"companion {companion.__version__}"
