"""What a newcomer does: build the wheel, ``pip install`` it into a fresh virtualenv (its
dependencies from the package index pip is configured with; pip's own cache is reused, nothing
is kept in the repository), then run ``companion demo`` offline from a folder that has no
``cards/``. The installed command finds the cards shipped in the wheel, the transcript has
replies and its end line, and ``companion -V`` answers.

The fresh virtualenv gets no pip of its own: the running pip installs into it (``--python``).
The same wheel and dependencies land in it, at a third of the CPU seconds (6 instead of 16 on
the 2-core machine: the venv's own pip costs 3.5 s to create, and the one Python bundles, older,
twice as long to install)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "node_modules"
)


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.early
@pytest.mark.timeout(900)
def test_the_wheel_installed_in_a_fresh_venv_runs_the_demo_from_another_folder(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the repository
    shutil.copytree(REPO, source, symlinks=True, ignore=_NOT_SOURCE)
    wheels = tmp_path / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        tmp_path,
        300,
    )
    [wheel] = wheels.glob("companion-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, 120)
    python = str(venv / "bin" / "python")
    _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", str(wheel)],
        tmp_path,
        600,
    )

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    companion = str(venv / "bin" / "companion")
    assert _run([companion, "-V"], elsewhere, 60).stdout.startswith("companion ")
    demo = [companion, "demo", "--max-turns", "3", "--pace", "0", "--timeout", "120"]
    done = _run(demo, elsewhere, 240)
    out = done.stdout
    assert out.startswith("companion demo: Juniper, Ostra, Pim (scripted)"), out
    replies = [line for line in out.splitlines() if " → " in line and "turn " in line]
    assert len(replies) >= 3, out
    assert out.rstrip().splitlines()[-1].startswith(("— stopped (turn_cap)", "— the conversation closed")), (
        out
    )
    assert "Traceback" not in done.stderr
