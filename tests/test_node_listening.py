"""A listen port is one node's: the checks before and after py-libp2p binds, on real sockets.

py-libp2p 0.8.1 binds its listeners with ``SO_REUSEPORT``, so the kernel lets a second node of
the same user listen on the same port. :func:`refuse_taken` catches a port already in use before
the host starts; :func:`_shared` (behind :func:`require_alone`) catches what a simultaneous
start let through: another listening socket on the same address and port in the kernel's table.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from companion.node.listening import ListenError, _shared, refuse_taken


@contextmanager
def listener(host: str = "127.0.0.1", port: int = 0) -> Iterator[socket.socket]:
    """A listening socket bound as py-libp2p binds its own (``SO_REUSEADDR`` and ``SO_REUSEPORT``)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(8)
        yield sock


def inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino


def test_a_port_in_use_is_refused_before_the_host_binds_it() -> None:
    with listener() as first:
        port = first.getsockname()[1]
        addr = f"/ip4/127.0.0.1/tcp/{port}"
        with pytest.raises(
            ListenError, match=rf"cannot listen on {addr} \(--listen\): the address is already in use"
        ):
            refuse_taken([addr])
    refuse_taken([addr, "/ip4/127.0.0.1/tcp/0"])  # free again; port 0 is never checked


def test_a_port_shared_through_so_reuseport_is_found_in_the_kernels_table() -> None:
    """What two nodes started in the same instant do: both bind (the kernel allows it) and each
    sees the other's socket beside its own."""
    with listener() as first:
        port = first.getsockname()[1]
        addr = f"/ip4/127.0.0.1/tcp/{port}"
        assert _shared([addr], {inode(first)}) is None  # alone
        with listener(port=port) as second:  # SO_REUSEPORT lets it in
            assert _shared([addr], {inode(second)}) == addr
            assert _shared([addr], {inode(first)}) == addr
            wildcard = f"/ip4/0.0.0.0/tcp/{port}"
            assert _shared([wildcard], {inode(second)}) == wildcard  # a wildcard covers it
            assert _shared([f"/ip4/127.0.0.2/tcp/{port}"], set()) is None  # another address
