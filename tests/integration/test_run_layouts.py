"""``companion run`` on data directories of old releases, of a newer one, and of a running companion.

- Each fixture directory of ``tests/layouts/`` (written by an old commit, see its README) runs
  under today's code: the same peer ids, every stored row still there (plus the new
  conversation's), a copy of each old store beside it, and the companions answer.
- A directory of a newer layout is refused (exit 2, the message once) with nothing changed.
- A second process for a companion that runs exits 2 naming the directory and the first
  process's pid; the first one goes on answering. One killed with SIGKILL leaves no lock behind.
- A ``--listen`` port that another node holds: exit 2, the error once (py-libp2p's listeners
  share ports with ``SO_REUSEPORT``: without the check both processes ran).
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import sqlite3
import sys
from pathlib import Path

import pytest

from companion.app.lines import PEER, peer_line
from companion.node.identity import load_or_create_key_pair
from companion.protocol import MESSAGES, Message, encode
from companion.store.layout import DATA_LAYOUT, MANIFEST
from companion.store.sqlite import DB_FILENAME
from support.layouts import COMPANIONS, FIXTURES, digest, rows, unpack, version
from support.live import spawn_run, start_run, stdout_line
from support.network import Network, Proc, network, warm_up

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CARDS = [ROOT / "cards" / "pim.yaml", ROOT / "cards" / "ostra.yaml"]
PERSON = "user_upgrader"


def peer_id_of(key: Path) -> str:
    from libp2p.peer.id import ID

    return str(ID.from_pubkey(load_or_create_key_pair(key).public_key).to_base58())


def ask(net: Network, run: Proc, text: str) -> str:
    """A bare peer connects to ``run``'s first node and asks both companions ``text``; the id of
    the first reply (from either), once it arrived. Warm-up messages to nobody come first, until
    one reached the companion: gossipsub sends nothing to a peer whose subscription it has not
    heard yet."""
    raw, _ = net.raw(None)
    raw.send({"op": "connect", "addr": run.event("started", 5)["addrs"][0]})
    raw.event("connected", 15)
    warm_up(raw, run, PERSON, [PERSON])  # to nobody: no conversation starts
    question = Message.create(PERSON, list(COMPANIONS), text, id="question")
    raw.send({"op": "publish", "topic": MESSAGES, "b64": base64.b64encode(encode(question)).decode()})

    def reply(event: dict[str, object]) -> bool:
        if event.get("event") != "message":
            return False
        params = json.loads(str(event["text"])).get("params", {})
        return params.get("from") in COMPANIONS and PERSON in params.get("to", [])

    answer = raw.wait_for(reply, 30, "a companion's reply")
    return str(json.loads(str(answer["text"]))["params"]["id"])


def plain_run(net: Network, name: str, card: Path, data: Path, listen: str) -> Proc:
    """``companion run CARD`` as a user types it (text logs: what a user reads on stderr)."""
    argv = [sys.executable, "-m", "companion.cli.run", str(card), "--no-mdns", "--listen", listen]
    proc = Proc(name, [*argv, "--data-dir", str(data)])
    net.procs.append(proc)
    return proc


def errors(proc: Proc) -> list[str]:
    return [line for line in proc.lines if '"level": "error"' in line or "Traceback" in line]


@pytest.mark.parametrize("name", FIXTURES)
def test_a_directory_of_an_old_release_runs_with_everything_it_held(tmp_path: Path, name: str) -> None:
    data = unpack(name, tmp_path, "data-old")
    stores = {cid: data / cid / DB_FILENAME for cid in COMPANIONS}
    before = {cid: rows(path) for cid, path in stores.items()}
    old = {cid: version(path) for cid, path in stores.items()}  # each fixture is older than today's
    peers = {cid: peer_id_of(data / "keys" / f"{cid}.key") for cid in COMPANIONS}
    old_files = digest(data)
    with network(tmp_path) as net:
        run = start_run(net, "old", CARDS)
        expected = {peer_line(cid, peer) for cid, peer in peers.items()}  # the same keys, the same ids
        for _ in COMPANIONS:
            expected.discard(stdout_line(run, lambda line: line in expected, 30))
        assert not expected
        reply = ask(net, run, "Hello again, do you remember me?")
        # the conversation ends before the stop (a stop during a turn: issue 32, item 4)
        run.event("conversation_over", 60)
        assert run.stop() == 0
        assert run.count("layout_migrated") == len(COMPANIONS)
        assert errors(run) == []
    for cid, path in stores.items():
        after = rows(path)
        for table, kept in before[cid].items():
            assert kept <= after[table], f"{name} {cid}: rows of {table} lost"
        ids = {row[1] for row in after["messages"]}
        assert {"question", reply} <= ids, f"{cid} recorded the new conversation"
        assert version(path) == DATA_LAYOUT
        assert rows(path.with_name(f"{DB_FILENAME}.v{old[cid]}.bak")) == before[cid]
    assert json.loads((data / MANIFEST).read_text())["layout"] == DATA_LAYOUT
    # the keys, the trust file and the replay ids were kept as they were (only appended to)
    for file, sha in old_files.items():
        if file.startswith("keys/") or file == "trust.json":
            assert digest(data)[file] == sha, file


def test_a_directory_of_a_newer_layout_is_refused_and_left_alone(tmp_path: Path) -> None:
    data = unpack("2026-12-05", tmp_path, "data-new")
    path = data / "companion_pim" / DB_FILENAME
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA user_version={DATA_LAYOUT + 1}")
    db.close()
    before = digest(data)
    with network(tmp_path) as net:
        run = spawn_run(net, "new", CARDS)
        assert run.reap(30) == 2
    refusals = [line for line in run.lines if f"data layout {DATA_LAYOUT + 1}" in line]
    assert len(refusals) == 1 and str(path) in refusals[0], run.tail()
    assert "Traceback" not in "\n".join(run.lines)
    after = digest(data)
    locks = {f"{cid}/lock" for cid in COMPANIONS}  # the locks it took while it checked
    assert set(after) - set(before) == locks
    assert {f: h for f, h in after.items() if f not in locks} == before  # nothing else changed


def test_a_second_process_for_a_running_companion_exits_2_and_the_first_goes_on(tmp_path: Path) -> None:
    with network(tmp_path) as net:
        first = start_run(net, "one", CARDS)
        stdout_line(first, lambda line: line.startswith(f"companion_ostra{PEER}"), 30)
        second = plain_run(net, "two", CARDS[0], net.tmp / "data-one", "/ip4/127.0.0.1/tcp/0")
        assert second.reap(30) == 2
        said = [line for line in second.lines if "in use" in line]
        assert said == [
            f"companion run: {net.tmp / 'data-one' / 'companion_pim'} is in use by process {first.pid} "
            "(companion_pim is running there already); stop that one first, "
            "or give this one another --data-dir"
        ], second.tail()
        assert not [line for line in second.lines if PEER in line]  # it started no node
        assert first.running
        ask(net, first, "Are you still there?")  # untouched: it answers
        first.event("conversation_over", 60)
        assert first.stop() == 0
        assert errors(first) == []


def test_a_listen_port_held_by_another_node_exits_2_saying_so_once(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a free port, for the first node to take
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listen = f"/ip4/127.0.0.1/tcp/{port}"
    with network(tmp_path) as net:
        first = plain_run(net, "one", CARDS[0], net.tmp / "data-one", listen)
        stdout_line(first, lambda line: line.startswith(f"companion_pim{PEER}"), 30)
        second = plain_run(net, "two", CARDS[1], net.tmp / "data-two", listen)
        assert second.reap(30) == 2
        lines = [line for line in second.lines if str(port) in line]
        assert lines == [
            f"companion run: cannot listen on {listen} (--listen): the address is already in use "
            f"(another program listens there); choose another port, e.g. /ip4/127.0.0.1/tcp/0 for a free one"
        ], second.tail()
        assert first.running and first.stop() == 0


def test_a_killed_companion_leaves_no_lock_behind(tmp_path: Path) -> None:
    """The kernel lets go of the lock when the process dies, however: SIGKILL, then the same
    companion starts again at once, with the same peer id."""
    data = tmp_path / "data"
    with network(tmp_path) as net:
        first = plain_run(net, "first", CARDS[0], data, "/ip4/127.0.0.1/tcp/0")
        line = stdout_line(first, lambda s: s.startswith(f"companion_pim{PEER}"), 30)
        assert (data / "companion_pim" / "lock").read_text() == f"{first.pid}\n"
        first.signal(signal.SIGKILL)
        assert first.reap(10) == -signal.SIGKILL
        again = plain_run(net, "again", CARDS[0], data, "/ip4/127.0.0.1/tcp/0")
        assert stdout_line(again, lambda s: s.startswith(f"companion_pim{PEER}"), 30) == line
        assert again.stop() == 0


def test_two_companions_share_a_data_directory_from_two_processes(tmp_path: Path) -> None:
    """The lock is a companion's, not the directory's: Pim and Ostra run from one data directory
    in two processes (keys, stores and locks apart; trust.json shared on purpose)."""
    data = tmp_path / "data"
    with network(tmp_path) as net:
        pim = plain_run(net, "pim", CARDS[0], data, "/ip4/127.0.0.1/tcp/0")
        ostra = plain_run(net, "ostra", CARDS[1], data, "/ip4/127.0.0.1/tcp/0")
        stdout_line(pim, lambda s: s.startswith(f"companion_pim{PEER}"), 30)
        stdout_line(ostra, lambda s: s.startswith(f"companion_ostra{PEER}"), 30)
        assert pim.stop() == 0 and ostra.stop() == 0
    assert {p.name for p in data.iterdir()} >= {"companion_pim", "companion_ostra", MANIFEST, "keys"}
