"""What a newcomer does: build the wheel, install it into a fresh virtualenv (its dependencies
from the package index the installer is configured with; the installer's cache is reused, nothing
is kept in the repository), then run ``companion demo`` offline from a folder that has no
``cards/``. The installed command finds the cards shipped in the wheel, the transcript has
replies and its end line, and ``companion -V`` answers.

The wheel is built and installed by uv, the installer the README's commands set up
(``scripts/venv.sh``), where the suite's virtualenv has it; by pip otherwise. uv took 8 CPU
seconds where pip took 21 (``pip wheel`` 7, ``pip install`` 14), in a suite that must fit in 6
minutes on 2 cores. The fresh virtualenv gets no installer of its own: the running one installs
into it."""

from __future__ import annotations

import os
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


def _run(
    argv: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env
    )
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.early
@pytest.mark.timeout(900)
def test_the_wheel_installed_in_a_fresh_venv_runs_the_demo_from_another_folder(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the repository
    shutil.copytree(REPO, source, symlinks=True, ignore=_NOT_SOURCE)
    wheels = tmp_path / "wheels"
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, 120)
    python = str(venv / "bin" / "python")
    uv = Path(sys.executable).with_name("uv")
    if uv.is_file():
        # uv's build environments leave lock files in TMPDIR: the test's folder, not /tmp
        env = {**os.environ, "TMPDIR": str(tmp_path), "UV_NATIVE_TLS": os.environ.get("UV_NATIVE_TLS", "1")}
        _run([str(uv), "build", "--wheel", "-q", "--out-dir", str(wheels), str(source)], tmp_path, 300, env)
        [wheel] = wheels.glob("companion-*.whl")
        _run([str(uv), "pip", "install", "-q", "--python", python, str(wheel)], tmp_path, 600, env)
    else:
        pip = [sys.executable, "-m", "pip"]
        _run([*pip, "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)], tmp_path, 300)
        [wheel] = wheels.glob("companion-*.whl")
        _run([*pip, "--python", python, "install", "-q", "--no-compile", str(wheel)], tmp_path, 600)

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
