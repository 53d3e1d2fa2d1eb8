"""The README as a newcomer reads it: every file it names exists, and the broken-card example
prints exactly what the README shows, through the installed command."""

from __future__ import annotations

import re
from pathlib import Path

from support.cli import run_companion

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")

# A path into the repository as the README spells one: a top-level folder, then a file name.
_PATH = re.compile(r"(?<![\w./-])((?:cards|docs|examples|scripts|tests|companion)/[\w./*-]*\w)")


def test_every_file_the_readme_names_exists() -> None:
    named = sorted(set(_PATH.findall(README)))
    assert "examples/pim-tools.yaml" in named and "cards/pim.yaml" in named
    missing = [p for p in named if not (list(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]
    assert missing == []


def test_the_broken_card_example_prints_what_the_readme_shows() -> None:
    block = re.search(r"```console\n\$ (companion card check [^\n]+)\n(.*?)```", README, re.S)
    assert block is not None
    command, shown = block.group(1).split()[1:], block.group(2)
    done = run_companion(command, cwd=ROOT, timeout=60)
    assert done.returncode == 1
    assert done.stdout == shown
