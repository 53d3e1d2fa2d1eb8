"""`companion run`: listen address planning, printable addresses, the handler seam, two cards."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from companion.app.engines import LoggingHandler, summarize
from companion.app.lines import dialable
from companion.app.run import Running, RunOptions, listen_addrs_for, run_nodes
from companion.memory import Inbound
from companion.protocol import MESSAGES, STATES, Message, State

CARD = Path(__file__).resolve().parent.parent / "cards"


def test_one_listen_address_counts_ports_up_per_card() -> None:
    assert listen_addrs_for(["/ip4/0.0.0.0/tcp/4001"], 3) == [
        "/ip4/0.0.0.0/tcp/4001",
        "/ip4/0.0.0.0/tcp/4002",
        "/ip4/0.0.0.0/tcp/4003",
    ]
    assert listen_addrs_for(["/ip4/127.0.0.1/tcp/0"], 2) == ["/ip4/127.0.0.1/tcp/0"] * 2
    assert listen_addrs_for([], 1) == ["/ip4/0.0.0.0/tcp/0"]
    assert listen_addrs_for(["/ip4/127.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/9"], 2)[1].endswith("/9")
    with pytest.raises(ValueError, match="one per card"):
        listen_addrs_for(["/ip4/127.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/2"], 3)
    with pytest.raises(ValueError, match="TCP"):
        listen_addrs_for(["/ip4/127.0.0.1/udp/1"], 2)


def test_wildcard_addresses_are_spelled_out() -> None:
    assert dialable("/ip4/127.0.0.1/tcp/1/p2p/X") == ["/ip4/127.0.0.1/tcp/1/p2p/X"]
    shown = dialable("/ip4/0.0.0.0/tcp/1/p2p/X")
    assert shown and all("/tcp/1/p2p/X" in a for a in shown)


def test_summaries_name_ids_and_senders() -> None:
    message = Message.create("user_1", ["companion_a"], "hello", id="m1")
    fields = summarize(Inbound(MESSAGES, message, "peer"))
    assert fields["id"] == "m1" and fields["sender"] == "user_1" and fields["text"] == "hello"
    states = summarize(Inbound(STATES, [State.create("companion_a", "speak", 5, True)], "peer"))
    assert states["states"] == [{"from": "companion_a", "state": "speak", "selected": True}]


async def test_two_cards_in_one_process_find_each_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="companion")
    made: list[Any] = []

    async def factory(card: Any, node: Any, nursery: trio.Nursery) -> LoggingHandler:
        made.append((card.card.metadata.id, node.name))
        return LoggingHandler(node.name)

    options = RunOptions(
        cards=[str(CARD / "pim.yaml"), str(CARD / "ostra.yaml")],
        listen=["/ip4/127.0.0.1/tcp/0"],
        peers=[],
        mdns=False,
        data_dir=tmp_path,
        stats_interval=None,
    )
    nodes: list[Any] = []
    ready = trio.Event()

    def on_ready(running: Running) -> None:
        nodes.extend(running.nodes)
        ready.set()

    with trio.move_on_after(20) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: run_nodes(options, handler_factory=factory, ready=on_ready))
            await ready.wait()
            pim, _ = nodes
            assert await pim.wait_for(lambda: set(pim.directory) == {"companion_pim", "companion_ostra"}, 10)
            with trio.fail_after(10):  # the first publish may precede the mesh: repeat until heard
                while not any(
                    getattr(r, "companion_fields", {}).get("node") == "companion_ostra"
                    and getattr(r, "companion_fields", {}).get("id") == "x1"
                    for r in caplog.records
                ):
                    await pim.publish(
                        MESSAGES, Message.create("companion_pim", ["companion_ostra"], "hi", id="x1")
                    )
                    await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert made == [("companion_pim", "companion_pim"), ("companion_ostra", "companion_ostra")]
    assert (tmp_path / "keys" / "companion_pim.key").exists()


async def test_a_bad_bootstrap_address_is_refused_before_anything_starts(tmp_path: Path) -> None:
    options = RunOptions([str(CARD / "pim.yaml")], [], ["/ip4/127.0.0.1/tcp/1"], False, tmp_path, None)
    with pytest.raises(ValueError, match="/p2p/"):
        await run_nodes(options)


async def test_an_unreachable_peer_delays_the_engine_by_the_head_start_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The engines wait for the first connections at most ``DIAL_HEAD_START``: with a ``--peer``
    that never answers (nothing listens there) the companion still gets its engine and is
    announced (``ready`` comes once the engines are)."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    from support.fake_llm_server import free_port

    nobody = ID.from_pubkey(create_new_key_pair().public_key)
    peer = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{nobody}"
    options = RunOptions([str(CARD / "pim.yaml")], ["/ip4/127.0.0.1/tcp/0"], [peer], False, tmp_path, None)
    got: list[Running] = []
    with trio.move_on_after(30) as scope:  # the head start, the imports, the scripted model
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: run_nodes(options, ready=got.append))
            while not got:
                await trio.sleep(0.05)
            (node,) = got[0].nodes
            assert node.connected_peers == []
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught, "the companion never became ready"
    assert f"companion_pim peer {node.peer_id}" in capsys.readouterr().out
