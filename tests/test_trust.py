"""The pin store in the data directory: format, durability, bounds, processes sharing it, and the
``companion trust`` command and flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from companion.cli import main as cli
from companion.node.trust import (
    TRUST_FILENAME,
    Pin,
    PinRefused,
    TrustError,
    TrustStore,
    parse_peer_id,
    parse_trust_flag,
)
from companion.protocol import APPROVAL_QUERY


def peer() -> str:
    return ID.from_pubkey(create_new_key_pair().public_key).to_base58()


A, B, C = peer(), peer(), peer()


def test_first_use_pins_are_written_and_read_back(tmp_path: Path) -> None:
    store = TrustStore.in_directory(tmp_path)
    pin = store.claim("companion_a", A)
    assert isinstance(pin, Pin) and (pin.peer_id, pin.source) == (A, "first_use") and pin.since
    assert store.claim("companion_a", A) == pin  # the owner again: nothing new
    assert store.claim("companion_a", B) == PinRefused("companion_a", B, "id_pinned", A)
    body = json.loads((tmp_path / TRUST_FILENAME).read_text())
    assert body == {
        "version": 1,
        "companions": {"companion_a": {"peer": A, "source": "first_use", "since": pin.since}},
        "approvers": [],
        "answerers": [],
    }
    again = TrustStore.in_directory(tmp_path)
    assert again.pin_of("companion_a") == pin
    assert again.ids_of(A) == {"companion_a"}


def test_a_peer_holds_one_first_use_pin_but_operator_pins_stay(tmp_path: Path) -> None:
    store = TrustStore.in_directory(tmp_path)
    store.add("companion_op", A)
    store.claim("companion_a", A)
    store.claim("companion_b", A)  # the same key now proves another id: its old first use goes
    assert store.pin_of("companion_a") is None
    assert store.ids_of(A) == {"companion_b", "companion_op"}


def test_memory_pins_take_precedence_and_are_never_written(tmp_path: Path) -> None:
    store = TrustStore.in_directory(tmp_path)
    store.claim("companion_a", A)
    store.hold("companion_a", B, "flag")  # --trust companion_a=B for this run
    assert store.pin_of("companion_a") == Pin("companion_a", B, "flag")
    assert store.claim("companion_a", A) == PinRefused("companion_a", A, "id_pinned", B)
    written = TrustStore.in_directory(tmp_path).pin_of("companion_a")
    assert written is not None and written.peer_id == A


def test_a_full_store_refuses_new_pins_and_keeps_the_old(tmp_path: Path) -> None:
    store = TrustStore(tmp_path / TRUST_FILENAME, capacity=2)
    store.claim("companion_a", A)
    store.claim("companion_b", B)
    assert store.claim("companion_c", C) == PinRefused("companion_c", C, "pin_store_full")
    assert store.claim("companion_a", A) == store.pin_of("companion_a")
    assert [p.companion_id for p in TrustStore.in_directory(tmp_path).pins()] == [
        "companion_a",
        "companion_b",
    ]


def test_changes_by_another_process_are_seen_by_a_running_store(tmp_path: Path) -> None:
    running = TrustStore.in_directory(tmp_path)
    running.claim("companion_a", A)
    operator = TrustStore.in_directory(tmp_path)
    operator.rekey("companion_a", B)
    operator.set_role(C, "answerer", True)
    assert running.claim("companion_a", B).peer_id == B
    assert running.claim("companion_a", A) == PinRefused("companion_a", A, "id_pinned", B)
    assert running.may_answer(C, "speak") and not running.may_answer(C, APPROVAL_QUERY)


def test_processes_writing_at_once_lose_no_pin(tmp_path: Path) -> None:
    """Nodes in several processes share one data directory (``companion demo`` does)."""
    peers = [[peer() for _ in range(15)] for _ in range(6)]
    script = (
        "import sys; from pathlib import Path; from companion.node.trust import TrustStore\n"
        "store = TrustStore.in_directory(Path(sys.argv[1]))\n"
        "for i, p in enumerate(sys.argv[3:]):\n"
        "    assert store.claim(f'companion_{sys.argv[2]}_{i}', p).peer_id == p\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(n), *mine])
        for n, mine in enumerate(peers)
    ]
    assert [proc.wait(timeout=60) for proc in procs] == [0] * len(peers)
    pins = TrustStore.in_directory(tmp_path).pins()
    assert sorted((p.companion_id, p.peer_id) for p in pins) == sorted(
        (f"companion_{n}_{i}", p) for n, mine in enumerate(peers) for i, p in enumerate(mine)
    )


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("{", "(the whole file)"),
        ('{"version": 2}', "version"),
        (
            '{"version": 1, "companions": {"companion_a": {"peer": "nope", "source": "first_use"}}}',
            "companion_a",
        ),
        (json.dumps({"version": 1, "companions": {"user_a": {"peer": A, "source": "first_use"}}}), "user_a"),
        (json.dumps({"version": 1, "companions": {"companion_a": {"peer": A, "source": "guess"}}}), "source"),
        (json.dumps({"version": 1, "approvers": [A, "12D3"]}), "approvers.1"),
        ('{"version": 1, "pins": {}}', "pins"),
    ],
    ids=["not-json", "version", "bad-peer", "user-pinned", "source", "approvers", "unknown-key"],
)
def test_a_broken_trust_file_fails_at_load_naming_file_field_and_fix(
    tmp_path: Path, content: str, where: str
) -> None:
    (tmp_path / TRUST_FILENAME).write_text(content)
    with pytest.raises(TrustError) as caught:
        TrustStore.in_directory(tmp_path)
    message = str(caught.value)
    assert str(tmp_path / TRUST_FILENAME) in message and where in message and "fix:" in message


def test_a_claim_the_file_could_not_load_back_is_never_written(tmp_path: Path) -> None:
    """A hostile peer's claim must not make the node refuse to start next time."""
    store = TrustStore.in_directory(tmp_path)
    huge = "companion_" + "x" * 60_000
    assert store.claim(huge, A) == PinRefused(huge, A, "not_a_companion_id")
    assert store.claim("companion_a", "not-a-peer-id").peer_id == "not-a-peer-id"
    assert store.claim("companion_b", B).peer_id == B
    again = TrustStore.in_directory(tmp_path)
    assert [p.companion_id for p in again.pins()] == ["companion_b"]


def test_a_running_store_keeps_its_pins_when_the_file_is_broken_by_hand(tmp_path: Path) -> None:
    store = TrustStore.in_directory(tmp_path)
    store.claim("companion_a", A)
    (tmp_path / TRUST_FILENAME).write_text("{ oops")
    assert store.claim("companion_a", B) == PinRefused("companion_a", B, "id_pinned", A)


def test_peer_ids_and_flags_are_checked() -> None:
    assert parse_peer_id(A) == A
    assert parse_peer_id(f"/ip4/127.0.0.1/tcp/4001/p2p/{A}") == A
    assert parse_peer_id("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N").startswith("Qm")  # RSA style
    for bad in ("", "12D3KooW", "peer-a", "0OIl", A + "x", "Qm" + "1" * 44):
        with pytest.raises(TrustError):
            parse_peer_id(bad)
    assert parse_trust_flag(f"companion_pim={A}") == ("companion_pim", A)
    for bad in (f"pim={A}", "companion_pim", "companion_pim=12D3"):
        with pytest.raises(TrustError, match="--trust"):
            parse_trust_flag(bad)


def test_companion_trust_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> tuple[int, str, str]:
        code = cli(["trust", "--data-dir", str(tmp_path), *args])
        out, err = capsys.readouterr()
        return code, out, err

    assert run("add", "companion_a", A)[0] == 0
    assert run("add", "companion_a", A)[0] == 0  # the same again is fine
    code, _, err = run("add", "companion_a", B)
    assert code == 2 and f"companion trust rekey companion_a {B}" in err
    assert run("rekey", "companion_a", f"/ip4/10.0.0.2/tcp/4001/p2p/{B}") == (
        0,
        f"companion_a pinned to {B} (was {A})\n",
        "",
    )
    assert run("add", "approver", C)[0] == 0
    code, out, _ = run("list", "--json")
    body = json.loads(out)
    assert body["companions"]["companion_a"]["peer"] == B
    assert body["companions"]["companion_a"]["source"] == "operator"
    assert body["approvers"] == [C] and body["answerers"] == []
    code, out, _ = run("list")
    assert f"companion_a  {B}  operator" in out and f"approver  {C}" in out
    assert run("remove", "approver", C)[0] == 0
    assert run("remove", "companion_a")[0] == 0
    assert run("remove", "companion_a")[0] == 2
    assert run("add", "user_x", A)[0] == 2
    assert run("add", "companion_x", "not-a-peer")[0] == 2
    assert TrustStore.in_directory(tmp_path).pins() == []


CARD = Path(__file__).resolve().parent.parent / "cards" / "pim.yaml"


def test_companion_run_refuses_a_broken_trust_file_or_flag_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / TRUST_FILENAME).write_text('{"version": 1, "approvers": ["nope"]}')
    assert cli(["run", str(CARD), "--no-mdns", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("companion run: ") and "trust.json: approvers.0" in err and "fix:" in err
    for flags in (["--trust", "companion_pim"], ["--approver", "12D3"], ["--answerer", "x"]):
        assert cli(["run", str(CARD), "--no-mdns", "--data-dir", str(tmp_path / "other"), *flags]) == 2
        assert flags[0] in capsys.readouterr().err
    assert cli(["bridge", "--no-mdns", "--data-dir", str(tmp_path), "--trust", "x=y"]) == 2
    assert "--trust" in capsys.readouterr().err
