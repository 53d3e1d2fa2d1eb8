"""A card naming a custom action (``module:attribute``) whose module Python cannot import, as a
user meets it: their card and its module in a folder of their own, checked with the installed
command. One problem (the file, line and field), whose fix says how to make it importable; doing
what the fix says makes the card load."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from support.cli import run_companion

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _env(pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def _own_folder(tmp_path: Path) -> Path:
    """The example greeter card and its action module, copied into a user's folder ``mine/``."""
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(EXAMPLES / "greeter.yaml", mine / "greeter.yaml")
    shutil.copy(EXAMPLES / "greeter_action.py", mine / "greeter_action.py")
    return mine


def _fix(stdout: str) -> str:
    found: list[str] = re.findall(r"^    fix: (.*)$", stdout, re.M)
    assert len(found) == 1, stdout  # one problem: the routine naming the action is not a second
    return found[0]


def test_a_module_beside_the_card_is_named_with_the_pythonpath_that_imports_it(tmp_path: Path) -> None:
    _own_folder(tmp_path)
    done = run_companion(["card", "check", "mine/greeter.yaml"], cwd=tmp_path, env=_env(None))
    assert done.returncode == 1
    assert done.stdout.startswith("mine/greeter.yaml: 1 problem\nmine/greeter.yaml:14: actions[1]: ")
    assert "'greeter_action:welcome' is not registered" in done.stdout
    fix = _fix(done.stdout)
    assert "PYTHONPATH=mine " in fix and "card's folder" in fix
    advised = re.search(r"PYTHONPATH=(\S+)", fix)
    assert advised is not None
    followed = run_companion(["card", "check", "mine/greeter.yaml"], cwd=tmp_path, env=_env(advised.group(1)))
    assert followed.returncode == 0, followed.stdout
    assert followed.stdout.startswith("OK mine/greeter.yaml (Wren")


def test_from_the_cards_own_folder_the_fix_is_pythonpath_dot(tmp_path: Path) -> None:
    mine = _own_folder(tmp_path)
    done = run_companion(["card", "check", "greeter.yaml"], cwd=mine, env=_env(None))
    assert done.returncode == 1 and "PYTHONPATH=. " in _fix(done.stdout)
    assert run_companion(["card", "check", "greeter.yaml"], cwd=mine, env=_env(".")).returncode == 0


def test_a_module_found_nowhere_and_a_missing_dependency_each_say_what_to_do(tmp_path: Path) -> None:
    mine = _own_folder(tmp_path)
    card = (mine / "greeter.yaml").read_text(encoding="utf-8")
    (mine / "nowhere.yaml").write_text(card.replace("greeter_action:welcome", "nowhere_mod:welcome"))
    done = run_companion(["card", "check", "nowhere.yaml"], cwd=mine, env=_env(None))
    fix = _fix(done.stdout)
    assert "make 'nowhere_mod' importable" in fix and "PYTHONPATH" in fix and "pip install" in fix
    (mine / "needs_dep.py").write_text("import not_installed_dependency_xyz\n")
    (mine / "dep.yaml").write_text(card.replace("greeter_action:welcome", "needs_dep:welcome"))
    done = run_companion(["card", "check", "dep.yaml"], cwd=mine, env=_env("."))
    fix = _fix(done.stdout)
    assert "'needs_dep' imports 'not_installed_dependency_xyz'" in fix and "pip install" in fix
