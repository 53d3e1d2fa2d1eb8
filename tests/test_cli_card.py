"""``companion card check`` and ``companion card schema`` through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from companion.cli import main

ROOT = Path(__file__).resolve().parent.parent
CARDS = ROOT / "cards"

BROKEN = """\
metadata:
  id: tess
  name: Tess
  personality: Quick.
  story: Ferry.
  sample: Hi.
role: Short.
actions: [speak]
events:
  params:
    type: object
    properties:
      energy: {type: integer}
  conditions:
    - expression: enrgy > 3
      execute:
        - {tool: speak, instruction: talk}
"""


def test_check_prints_ok_for_each_example_card(capsys: pytest.CaptureFixture[str]) -> None:
    paths = sorted(CARDS.glob("*.yaml"))
    assert main(["card", "check", *map(str, paths)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(paths) == 3
    for path, line in zip(paths, out, strict=True):
        assert line.startswith(f"OK {path} (") and ", 4 conditions, tools: speak" in line
    assert f"OK {CARDS / 'ostra.yaml'} (Ostra, 4 conditions, tools: speak, companions)" in out


def test_check_accepts_a_directory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "check", str(CARDS)]) == 0
    assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("OK ")]) == 3


def test_check_reports_every_problem_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN, encoding="utf-8")
    good = CARDS / "pim.yaml"
    assert main(["card", "check", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"OK {good} (Pim, 4 conditions, tools: speak)" in out
    assert f"{bad}: 2 problems" in out
    assert f"{bad}:2: metadata.id: companion id 'tess' does not start with 'companion_'" in out
    assert f"{bad}:15: events.conditions[0].expression: CEL 1:1: undeclared reference to 'enrgy'" in out
    assert "    enrgy > 3\n    ^\n" in out
    assert "fix: did you mean 'energy'?" in out


def test_missing_file_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "check", str(tmp_path / "nope.yaml")]) == 1
    assert "cannot read the card" in capsys.readouterr().out


def test_files_that_are_not_cards_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# cards\n", encoding="utf-8")
    assert main(["card", "check", str(readme), str(CARDS / "juniper.yaml")]) == 0
    assert f"skipped {readme}" in capsys.readouterr().out


def test_empty_directory_is_noted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "check", str(tmp_path)]) == 0
    assert "holds no .yaml, .yml or .toml cards" in capsys.readouterr().out


def test_schema_prints_the_card_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "CompanionCard"
    assert "events" in schema["properties"]


def test_card_without_an_action_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["card"])
    assert info.value.code == 2


def test_the_installed_command_checks_the_example_cards() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "companion", "card", "check", *sorted(map(str, CARDS.glob("*.yaml")))],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("OK ") == 3
