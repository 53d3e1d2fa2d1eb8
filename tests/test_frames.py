"""A writer whose deadline passes while it writes must not break the connection (frames.py)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.network.connection.exceptions import RawConnError
from libp2p.peer.id import ID
from libp2p.stream_muxer.yamux.yamux import FLAG_SYN, TYPE_PING, YAMUX_HEADER_FORMAT
from node_support import raw_peer, until

from companion.node.frames import write_whole_frames

ECHO = TProtocol("/companion-test/echo/1")
PING = struct.pack(YAMUX_HEADER_FORMAT, 0, TYPE_PING, FLAG_SYN, 0, 7)


async def _echo(stream: Any) -> None:
    await stream.write(await stream.read(64))
    await stream.close()


async def test_a_writer_cancelled_as_it_is_handed_the_write_lock_leaves_the_connection_working() -> None:
    """The race: a writer waiting for the muxer's write lock is handed it in the same tick its
    deadline passes. py-libp2p's Noise encrypted the frame (spending a nonce), then trio raised
    ``Cancelled`` at the socket: the frame never left, the peer could not decrypt the next one
    and closed the connection (both sides listed none a second later). Now the frame leaves,
    the writer is cancelled after it, and the connection carries the next stream."""
    async with raw_peer() as a, raw_peer() as b:
        b.host.set_stream_handler(ECHO, _echo)
        await a.connect(b.addr)
        to_b, to_a = ID.from_base58(b.peer_id), ID.from_base58(a.peer_id)
        # the connection's opening chatter (identify, subscriptions) is over
        await until(lambda: to_b in a.pubsub.peers and to_a in b.pubsub.peers, 5)
        await trio.sleep(0.2)
        muxed = a.host.get_network().connections[to_b][0].muxed_conn
        scope = trio.CancelScope()
        outcome: list[str] = []

        async def writer() -> None:
            with scope:
                try:
                    await muxed._write_frame(PING)
                except trio.Cancelled:
                    outcome.append("cancelled")
                    raise

        async with trio.open_nursery() as nursery:
            await muxed._write_lock.acquire()
            nursery.start_soon(writer)
            await trio.sleep(0.1)  # the writer waits for the lock, alone (else it is not handed it)
            assert muxed._write_lock.statistics().tasks_waiting == 1
            muxed._write_lock.release()  # handed to the writer...
            scope.cancel()  # ...as its deadline passes, before it runs
        assert outcome == ["cancelled"]

        await muxed._write_frame(PING)  # the frame after it: b decrypts it, or closes
        with trio.fail_after(5):
            stream = await a.host.new_stream(to_b, [ECHO])
            await stream.write(b"still here")
            assert await stream.read(64) == b"still here"
        assert stream.muxed_conn is muxed, "the echo took a new connection: the first one broke"
        assert not muxed.is_closed and b.host.get_network().connections.get(to_a)


class _StuckSocket:
    """A secured connection whose writes never finish (a peer that stopped reading, its socket
    buffer full); closing it is recorded."""

    def __init__(self) -> None:
        self.writes = 0
        self.closed = False

    async def write(self, data: bytes) -> None:
        self.writes += 1
        await trio.sleep_forever()

    async def close(self) -> None:
        self.closed = True


class _Muxer:
    def __init__(self) -> None:
        self.secured_conn = _StuckSocket()
        self.peer_id = "peer"


async def test_a_frame_that_cannot_leave_closes_its_connection_at_the_deadline(autojump_clock: Any) -> None:
    """A shielded write still ends: past its deadline the frame may be half sent, so the
    connection is closed and the write fails as on a closed connection, even for a caller
    whose own scope was cancelled meanwhile."""
    muxer = _Muxer()
    write_whole_frames(muxer, deadline=10.0)
    start = trio.current_time()
    with trio.CancelScope() as caller:
        caller.deadline = start + 1.0  # the caller gives up first: the frame is not cut
        with pytest.raises(RawConnError):
            await muxer.secured_conn.write(b"frame")
    assert trio.current_time() - start == pytest.approx(10.0)
    assert muxer.secured_conn.closed


async def test_a_writer_already_cancelled_writes_nothing() -> None:
    """Cancelled before the frame is encrypted: nothing is spent, the cancellation is raised as
    before and the connection is untouched."""
    muxer = _Muxer()
    write_whole_frames(muxer)
    write_whole_frames(muxer)  # once only
    with trio.CancelScope() as scope:
        scope.cancel()
        await muxer.secured_conn.write(b"frame")
    assert scope.cancelled_caught
    assert muxer.secured_conn.writes == 0 and not muxer.secured_conn.closed
