"""What the node adds to py-libp2p 0.8.1 to reach peers beyond one LAN, against real hosts on
127.0.0.1: advertised addresses (wildcards, circuit addresses) and an AutoNAT dial-back that
really dials."""

from __future__ import annotations

import socket
from typing import Any

import multiaddr
import pytest
import trio
import trio.testing
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.host.autonat import AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.peerinfo import info_from_p2p_addr

from companion.node.addresses import AdvertisedAddrs, expand_wildcard
from companion.node.config import NodeConfig, make_host
from companion.node.relay import DialBackAutoNAT, circuit_addr, is_circuit

RELAY = "/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWRmJY6b5cxrVzEUrJ82hRXKw2NjFgebg76b3ARcE5Z64x"


def closed_port() -> int:
    """A TCP port on 127.0.0.1 with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_wildcard_spelled_out_per_interface() -> None:
    out = expand_wildcard("/ip4/0.0.0.0/tcp/4001")
    assert out and all("/ip4/0.0.0.0/" not in a for a in out)
    assert "/ip4/127.0.0.1/tcp/4001" in out
    assert "/ip4/127.0.0.1/tcp/4001" not in expand_wildcard("/ip4/0.0.0.0/tcp/4001", loopback=False)
    assert expand_wildcard("/ip4/192.168.1.5/tcp/1") == ["/ip4/192.168.1.5/tcp/1"]


def test_max_connections_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        NodeConfig(max_connections=0)


async def test_circuit_address_advertised_whole() -> None:
    """py-libp2p's own get_addrs cuts ``<relay>/p2p/R/p2p-circuit`` to the relay's address (and
    would advertise the relay under our id); ours keeps it whole and spells out 0.0.0.0."""
    host = make_host(NodeConfig(listen=("/ip4/0.0.0.0/tcp/0",)), create_new_key_pair())
    advertised = AdvertisedAddrs()
    advertised.install(host)
    own = host.get_id().to_base58()
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/0.0.0.0/tcp/0")]):
        advertised.circuits["relay"] = circuit_addr(RELAY)
        addrs = [str(a) for a in host.get_addrs()]
        await host.close()
    assert f"{RELAY}/p2p-circuit/p2p/{own}" in addrs
    assert not any("/ip4/0.0.0.0/" in a for a in addrs)
    assert not any(a.startswith("/ip4/203.0.113.7/") and not is_circuit(a) for a in addrs)
    assert all(a.endswith(f"/p2p/{own}") for a in addrs)


async def test_shipped_addrs_factory_mangles_circuit_addresses() -> None:
    """Why AdvertisedAddrs replaces get_addrs: the documented addrs_factory hook loses the
    circuit (if this starts failing, py-libp2p fixed it and addresses.py can use the hook)."""
    factory: Any = lambda addrs: [*addrs, circuit_addr(RELAY)]  # noqa: E731
    config = NodeConfig(extra_host_options={"addrs_factory": factory})
    host = make_host(config, create_new_key_pair())
    own = host.get_id().to_base58()
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        addrs = [str(a) for a in host.get_addrs()]
        await host.close()
    assert f"/ip4/203.0.113.7/tcp/4001/p2p/{own}" in addrs
    assert not any(is_circuit(a) for a in addrs)


async def _ask_dialback(server_cls: type[AutoNATService], addr: str) -> int:
    """A client connected to a server asks it to dial back ``addr``; the verdict's status."""
    server = make_host(NodeConfig(), create_new_key_pair())
    client = make_host(NodeConfig(), create_new_key_pair())
    service = server_cls(server, serve=True)
    if isinstance(service, DialBackAutoNAT):
        service.dial_timeout = 2.0
    asker = AutoNATService(client, serve=False)
    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
    async with server.run(listen_addrs=listen), client.run(listen_addrs=listen):
        with trio.fail_after(10):
            await client.connect(info_from_p2p_addr(server.get_addrs()[0]))
            real = str(client.get_addrs()[0]).rsplit("/p2p/", 1)[0]
            target = addr.replace("REAL", real)
            status, _ = await asker.query_server(server.get_id(), [multiaddr.Multiaddr(target).to_bytes()])
        await client.close()
        await server.close()
    return status


async def test_dialback_to_a_closed_port_fails() -> None:
    status = await _ask_dialback(DialBackAutoNAT, f"/ip4/127.0.0.1/tcp/{closed_port()}")
    assert status == Message.E_DIAL_ERROR


async def test_dialback_to_the_real_address_succeeds() -> None:
    assert await _ask_dialback(DialBackAutoNAT, "REAL") == Message.OK


async def test_shipped_dialback_says_ok_for_a_closed_port() -> None:
    """The bug DialBackAutoNAT fixes: py-libp2p's server 'dials' with host.connect, which
    returns at once for a connected peer, so an address nobody listens on is 'reachable'."""
    assert await _ask_dialback(AutoNATService, f"/ip4/127.0.0.1/tcp/{closed_port()}") == Message.OK


async def test_dcutr_drives_hole_punches_only_while_a_relayed_connection_is_open(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """py-libp2p's drive loop wakes every 2 s to scan every connection; an idle node without a
    relayed connection (almost all of them) no longer runs it."""
    from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol

    from companion.node.relay import LoggedDCUtR

    scans: list[float] = []

    async def shipped_drive(self: Any) -> None:  # the shipped loop: a scan every 2 s
        while True:
            scans.append(trio.current_time())
            await trio.sleep(2.0)

    monkeypatch.setattr(DCUtRProtocol, "_auto_drive_loop", shipped_drive)
    pulse = trio.Event()
    relayed = False

    async def wait_for_change() -> None:
        await pulse.wait()

    def change(now_relayed: bool) -> None:
        nonlocal pulse, relayed
        relayed = now_relayed
        pulse.set()
        pulse = trio.Event()

    dcutr = LoggedDCUtR(make_host(NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",)), create_new_key_pair()))
    dcutr.wait_for_change = wait_for_change
    monkeypatch.setattr(dcutr, "_holds_relayed", lambda: relayed)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dcutr._auto_drive_loop)
        await trio.sleep(60)
        change(False)  # a direct connection opens: still nothing to drive
        await trio.sleep(60)
        assert scans == []
        change(True)  # a relayed connection: the shipped loop runs
        await trio.sleep(9)
        assert len(scans) == 5
        change(False)  # upgraded or closed: it stops
        await trio.sleep(60)
        assert len(scans) == 5
        nursery.cancel_scope.cancel()
