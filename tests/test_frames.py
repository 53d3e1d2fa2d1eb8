"""A writer whose deadline passes while it writes must not break the connection (frames.py)."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.network.connection.exceptions import RawConnError
from libp2p.peer.id import ID
from libp2p.stream_muxer.yamux.yamux import FLAG_SYN, TYPE_PING, YAMUX_HEADER_FORMAT

from companion.node.frames import CLOSE_GRACE, FRAME_WRITE_DEADLINE, write_whole_frames
from support.nodes import raw_peer, until

ECHO = TProtocol("/companion-test/echo/1")
PING = struct.pack(YAMUX_HEADER_FORMAT, 0, TYPE_PING, FLAG_SYN, 0, 7)


async def _echo(stream: Any) -> None:
    await stream.write(await stream.read(64))
    await stream.close()


ALONE_ATTEMPTS = 20
"""Tries at having the test's writer wait for the write lock alone: the connection's own chatter
(identify, subscriptions, grafts) also writes, later than usual on a loaded machine."""
OUTCOME_WAIT = 15.0
"""Seconds the test waits for the peers' streams and the echo: generous, for a loaded machine."""


async def _hand_the_lock_as_the_deadline_passes(muxed: Any) -> list[str] | None:
    """The race, once: a writer waits for the muxer's write lock, is handed it, and its scope is
    cancelled before it runs. Returns what the writer saw, or ``None`` if another task waited
    for the lock too (the writer is then cancelled while waiting, never handed the lock)."""
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
        await trio.sleep(0.1)  # the writer runs and parks on the lock (any load: one scheduler pass)
        alone = muxed._write_lock.statistics().tasks_waiting == 1
        if not alone:
            scope.cancel()  # not the race: the writer leaves the queue before the lock is handed on
        muxed._write_lock.release()  # handed to the writer...
        scope.cancel()  # ...as its deadline passes, before it runs
    return outcome if alone else None


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
        # most of the connection's opening chatter (identify, subscriptions) is over
        await until(lambda: to_b in a.pubsub.peers and to_a in b.pubsub.peers, OUTCOME_WAIT)
        muxed = a.host.get_network().connections[to_b][0].muxed_conn
        for _attempt in range(ALONE_ATTEMPTS):
            outcome = await _hand_the_lock_as_the_deadline_passes(muxed)
            if outcome is not None:
                break
        else:
            raise AssertionError(f"another writer waited for the lock in all {ALONE_ATTEMPTS} attempts")
        assert outcome == ["cancelled"]

        await muxed._write_frame(PING)  # the frame after it: b decrypts it, or closes
        with trio.fail_after(OUTCOME_WAIT):
            stream = await a.host.new_stream(to_b, [ECHO])
            await stream.write(b"still here")
            assert await stream.read(64) == b"still here"
        assert stream.muxed_conn is muxed, "the echo took a new connection: the first one broke"
        assert not muxed.is_closed and b.host.get_network().connections.get(to_a)


class _StuckSocket:
    """A secured connection whose writes never finish (a peer that stopped reading, its socket
    buffer full) until it is closed; closing it is recorded."""

    def __init__(self) -> None:
        self.writes = 0
        self.closed = False

    async def write(self, data: bytes) -> None:
        self.writes += 1
        if not self.closed:
            await trio.sleep_forever()

    async def close(self) -> None:
        self.closed = True


class _Muxer:
    """Yamux's shape where it matters here: frames go out one at a time under a lock, and a
    close writes its GO_AWAY frame behind them before it closes the secured connection."""

    def __init__(self) -> None:
        self.secured_conn = _StuckSocket()
        self.peer_id = "peer"
        self._write_lock = trio.Lock()

    async def write_frame(self, data: bytes) -> None:
        async with self._write_lock:
            await self.secured_conn.write(data)

    async def close(self) -> None:
        with contextlib.suppress(RawConnError):
            await self.write_frame(b"go away")
        await self.secured_conn.close()


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


async def test_closing_a_connection_cuts_a_stuck_frame_after_the_grace(autojump_clock: Any) -> None:
    """A muxer's close waits for the frame in flight (its GO_AWAY goes behind it): once it is
    closing, a stuck frame has ``close_grace`` left, not what remained of its deadline, and the
    close ends soon after."""
    muxer = _Muxer()
    write_whole_frames(muxer, deadline=10.0, close_grace=1.0)
    cut: list[float] = []

    async def writer() -> None:
        with pytest.raises(RawConnError):
            await muxer.write_frame(b"frame")
        cut.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.sleep(2.0)  # the frame is stuck, 8 s of its deadline left
        start = trio.current_time()
        await muxer.close()
    assert trio.current_time() - start == pytest.approx(1.0)
    assert cut == [pytest.approx(start + 1.0)]
    assert muxer.secured_conn.closed


async def test_a_node_closing_a_connection_whose_peer_stopped_reading_is_not_held_up() -> None:
    """The real stack: a's socket takes no more bytes (b stopped reading; simulated under
    Noise, where the socket would block), a frame is stuck in a's write, and a closes the
    connection. Yamux's close waits for the write lock to send GO_AWAY: it used to wait out the
    frame's 10 s deadline, past a node's own stop deadline (5 s); now it ends within the close
    grace, and b sees the connection go."""
    async with raw_peer() as a, raw_peer() as b:
        await a.connect(b.addr)
        to_b, to_a = ID.from_base58(b.peer_id), ID.from_base58(a.peer_id)
        await until(lambda: to_b in a.pubsub.peers and to_a in b.pubsub.peers, OUTCOME_WAIT)
        muxed = a.host.get_network().connections[to_b][0].muxed_conn
        raw = muxed.secured_conn.conn.read_writer.read_write_closer
        write = raw.write
        full = trio.Event()

        async def full_socket(data: bytes) -> None:
            full.set()
            await trio.sleep_forever()

        async def writer() -> None:  # its frame, or one the host wrote just before, is stuck
            with contextlib.suppress(RawConnError):
                await muxed._write_frame(PING)

        async with trio.open_nursery() as nursery:
            raw.write = full_socket
            nursery.start_soon(writer)
            await full.wait()
            raw.write = write  # the socket itself is fine: the close may reach it
            start = trio.current_time()
            with trio.move_on_after(FRAME_WRITE_DEADLINE):
                await muxed.close()
            took = trio.current_time() - start
        assert took < CLOSE_GRACE + 2.0, f"the close took {took:.1f} s"
        assert muxed.is_closed
        await until(lambda: not b.host.get_network().connections.get(to_a), 5)
