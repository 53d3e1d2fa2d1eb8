"""The command-line edges of the bridge and the terminal client."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from companion.cli import build_parser, main
from companion.cli.options import TOKEN_ENV, parse_ws_address, resolve_token


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9000", ("::1", 9000)),
        ("ws://localhost:8081/", ("localhost", 8081)),
    ],
)
def test_ws_addresses(value: str, expected: tuple[str, int]) -> None:
    assert parse_ws_address(value) == expected


@pytest.mark.parametrize("value", ["localhost", ":8080", "127.0.0.1:http", "127.0.0.1:70000", "[::1]8080"])
def test_bad_ws_addresses_say_what_is_expected(value: str) -> None:
    with pytest.raises(ValueError, match="--ws"):
        parse_ws_address(value)


def test_token_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert resolve_token(None) is None
    assert resolve_token("given") == "given"
    generated = resolve_token("")
    assert generated is not None and len(generated) >= 20
    assert resolve_token("") != generated
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert resolve_token(None) == "from-env"
    assert resolve_token("") == "from-env"
    assert resolve_token("given") == "given"


def test_subcommands_are_registered() -> None:
    args = build_parser().parse_args(["bridge", "--ws", "127.0.0.1:0", "--token", "--states"])
    assert args.command == "bridge" and args.token == "" and args.states
    args = build_parser().parse_args(["listen", "--as", "user_mika", "--voice"])
    assert args.command == "listen" and args.user_id == "user_mika" and args.voice


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bridge", "--ws", "nowhere"]) == 2
    assert "--ws 'nowhere'" in capsys.readouterr().err
    assert main(["bridge", "--max-queue", "0"]) == 2
    assert main(["listen", "--as", "mika"]) == 2
    assert "user_NAME" in capsys.readouterr().err


def test_beyond_loopback_a_token_is_generated_and_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    from companion.app.bridge import BridgeOptions, client_urls

    local = BridgeOptions(host="127.0.0.1", port=8080)
    assert local.token is None and not local.token_generated
    assert not any(url.startswith("token:") for url in client_urls(local, 8080))
    lan = BridgeOptions(host="0.0.0.0", port=8080)
    assert lan.token is not None and len(lan.token) >= 20 and lan.token_generated
    urls = client_urls(lan, 8080)
    assert urls[0] == f"ws://0.0.0.0:8080/?token={lan.token}"
    assert urls[-1].startswith(f"token: {lan.token} (generated")
    given = BridgeOptions(host="192.168.1.5", port=8080, token="mine")
    assert given.token == "mine" and not given.token_generated


def test_rate_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bridge", "--rate", "0"]) == 2
    assert "--rate/--burst" in capsys.readouterr().err
    assert main(["bridge", "--burst", "0"]) == 2
    assert main(["bridge", "--total-rate", "-1"]) == 2
    assert "--total-rate" in capsys.readouterr().err


def test_an_address_in_use_is_an_error_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [
            "bridge",
            "--ws",
            f"127.0.0.1:{port}",
            "--no-mdns",
            "--no-webrtc",
            "--data-dir",
            str(tmp_path),
        ]
        assert main([*argv, "--listen", "/ip4/127.0.0.1/tcp/0", "--log-level", "WARNING"]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port} (--ws): the address is already in use" in err
    assert "Traceback" not in err


def test_the_peer_id_is_printed_and_kept(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bridge", "--print-peer-id", "--data-dir", str(tmp_path)]) == 0
    first = capsys.readouterr().out.strip()
    assert first.startswith("12D3KooW")
    assert (tmp_path / "keys" / "bridge.key").stat().st_mode & 0o077 == 0
    assert main(["bridge", "--print-peer-id", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == first
