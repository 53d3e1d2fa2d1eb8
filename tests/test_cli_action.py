"""``companion action run --dry-run``: the typed result on stdout, the envelopes it would have
published, the stored values read but never written, and the exit status for each outcome."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from companion.actions import KeyValueStore
from companion.cli import main
from companion.store.sqlite import DB_FILENAME

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CARD = """
metadata: {id: companion_tess, name: Tess, personality: p, story: s, sample: hi}
role: You test things.
actions: [speak, "support.routines:ping", "support.routines:jam", "support.routines:guarded"]
knowledge: [companions]
events:
  params: {type: object, properties: {}}
  conditions: [{expression: "true", execute: [{tool: speak, instruction: Reply.}]}]
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = main(["action", "run", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else {}), err


@pytest.fixture
def card(tmp_path: Path) -> Path:
    path = tmp_path / "tess.yaml"
    path.write_text(CARD)
    return path


def test_the_example_runs_offline_and_prints_what_it_would_publish(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    args = [str(EXAMPLES / "greeter.yaml"), "welcome", "--dry-run", "--data-dir", str(tmp_path)]
    code, printed, _ = run(capsys, *args, "--input", '{"companion": "companion_pim"}')
    assert code == 0 and printed["status"] == "ok" and printed["dry_run"] is True
    [sent] = printed["would_publish"]
    assert sent["topic"] == "messages"
    assert sent["envelope"]["params"]["message"] == "Welcome, companion_pim!"
    assert sent["envelope"]["params"]["from"] == "companion_wren"
    assert printed["notes"] == ["companion_pim has now visited 1 times"]


def test_stored_values_are_read_and_never_written(
    capsys: pytest.CaptureFixture[str], card: Path, tmp_path: Path
) -> None:
    db = tmp_path / "companion_tess" / DB_FILENAME
    db.parent.mkdir(parents=True)
    with KeyValueStore.open(db) as kv:
        kv.namespace("companion_tess", "ping").set("count", 41)
    for _ in range(2):
        code, printed, _ = run(capsys, str(card), "ping", "--dry-run", "--data-dir", str(tmp_path))
        assert code == 0
        [sent] = printed["would_publish"]
        assert sent["envelope"]["params"]["params"] == {"count": 42}
    assert sorted(p.name for p in db.parent.iterdir()) == [DB_FILENAME]  # no -wal or -shm left
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM action_store").fetchall() == [("41",)]


def test_exit_codes_say_who_must_fix_what(
    capsys: pytest.CaptureFixture[str], card: Path, tmp_path: Path
) -> None:
    common = ["--dry-run", "--data-dir", str(tmp_path)]
    code, printed, err = run(capsys, str(card), "pong", *common)
    assert code == 2 and printed["status"] == "not_found"
    assert "available: companions, guarded, jam, ping, speak" in err
    code, printed, err = run(capsys, str(card), "speak", *common, "--input", '{"message": 5, "to": "x"}')
    assert code == 2 and printed["code"] == -32004
    assert {i["path"] for i in printed["issues"]} >= {"message", "to"}
    code, _, err = run(capsys, str(card), "ping", *common, "--input", "[1]")
    assert code == 2 and "JSON object" in err
    code, _, err = run(capsys, str(card), "ping", *common, "--input", "{oops")
    assert code == 2 and "not JSON" in err
    code, printed, _ = run(capsys, str(card), "jam", *common)
    assert code == 1 and printed["status"] == "internal_error" and printed["code"] == -32603
    code, printed, _ = run(capsys, str(card), "guarded", *common)
    assert code == 1 and printed["status"] == "refused" and printed["would_publish"][0]["topic"] == "queries"
    code, printed, _ = run(capsys, str(card), "guarded", *common, "--approve")
    assert code == 0 and [s["topic"] for s in printed["would_publish"]] == ["queries", "actions"]
    broken = tmp_path / "broken.yaml"
    broken.write_text(CARD.replace("support.routines:ping", "support.routines:pong"))
    code, _, err = run(capsys, str(broken), "ping", *common)
    assert code == 2 and "broken.yaml" in err and "pong" in err
