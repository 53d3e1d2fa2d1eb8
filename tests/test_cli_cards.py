"""The example cards ship with the package: a user who installed companion and stands in any
folder can name them (``pim``, ``cards/pim.yaml``) and run the demo, through the installed command."""

from __future__ import annotations

from pathlib import Path

from companion.app.cards import packaged_cards, resolve_card
from support.cli import run_companion


def test_card_names_resolve_to_the_packaged_cards_from_another_folder(tmp_path: Path) -> None:
    done = run_companion(["card", "check", "pim", "ostra.yaml", "cards/juniper.yaml"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["OK"] * 3
    assert str(packaged_cards() / "pim.yaml") in done.stdout


def test_a_file_in_the_working_folder_wins_over_a_packaged_card(tmp_path: Path) -> None:
    own = tmp_path / "pim.yaml"
    own.write_text((packaged_cards() / "pim.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "pim.png").write_bytes((packaged_cards() / "pim.png").read_bytes())  # its face
    done = run_companion(["card", "check", "pim.yaml"], cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("OK pim.yaml ")
    assert resolve_card(tmp_path / "nothing.yaml") == tmp_path / "nothing.yaml"
    assert resolve_card("elsewhere/pim.yaml") == Path("elsewhere/pim.yaml")  # only a bare name or cards/


def test_an_unknown_card_name_is_refused_naming_it(tmp_path: Path) -> None:
    done = run_companion(["run", "nobody", "--no-mdns"], cwd=tmp_path)
    assert done.returncode == 2
    assert "nobody" in done.stderr and "Traceback" not in done.stderr


def test_the_demo_finds_the_packaged_cards_from_another_folder(tmp_path: Path) -> None:
    done = run_companion(["demo", "--in-memory", "--max-turns", "2", "--pace", "0"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no card files" not in done.stderr
    assert done.stdout.startswith("companion demo: ") and "— stopped (turn_cap)" in done.stdout
