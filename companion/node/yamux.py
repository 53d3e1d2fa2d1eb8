"""Yamux with its receive-window updates batched, as go-yamux batches them (py-libp2p 0.8.1).

go-yamux (and the Yamux spec's intent) credits the sender once the reader has consumed half of
the receive window: one WINDOW_UPDATE frame per 128 KiB read, whatever the size of the reads.
py-libp2p 0.8.1's ``YamuxStream._auto_tune_and_send_window_update`` has a "partial slack" branch
that credits any read smaller than half the window at once, so even with its own switch
``PY_YAMUX_RELEASE_ON_READ=0`` a stream of small RPCs (every gossipsub message) sends a window
update for every other read (measured: 157 updates for 300 writes of 300 bytes; 303 with the
switch at 1), each a frame the peer must decrypt and handle, and a write on our side.

:func:`batch_window_updates` makes one connection's streams credit the window once
:data:`CREDIT_BATCH` (16 KiB) was consumed (:class:`BatchedYamuxStream`): 5 updates for the same
300 writes (go-yamux waits for half the window; a smaller batch keeps senders from ever waiting
on it under load). The send side, the frames and the protocol are unchanged (every Yamux,
aikyo's js-libp2p too, handles updates of any size at any time). py-libp2p builds its ``Yamux``
by name in ``MuxerMultistream.new_conn`` (a class given in ``muxer_opt`` is ignored) and its
streams by name in ``Yamux.open_stream`` and ``Yamux.handle_incoming``; rather than copy those
methods, every stream entering a connection's ``streams`` table takes the subclass (it adds no
state, only the one method). The node does it for every connection as it opens
(``node._ConnectionEvents``).
"""

from __future__ import annotations

from typing import Any, Final

from libp2p.stream_muxer.yamux.yamux import Yamux, YamuxStream

__all__ = ["CREDIT_BATCH", "BatchedYamuxStream", "batch_window_updates"]

CREDIT_BATCH: Final = 16 * 1024
"""Bytes read before the window is credited back (at most half the window): a sixteenth of the
256 KiB window, so a sender is never held up by the batching (it would block only 240 KiB
behind, as with py-libp2p's own credit) while a stream of 1 KB RPCs sends one update per ~12
reads instead of one per two."""


class BatchedYamuxStream(YamuxStream):
    """A Yamux stream that sends a WINDOW_UPDATE once :data:`CREDIT_BATCH` bytes were read."""

    async def _auto_tune_and_send_window_update(self, *, bytes_read: int = 0) -> None:
        increment = 0
        async with self.window_lock:
            buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
            consumed = self.target_recv_window - (self.recv_window + buffered)
            # half the window at most; py-libp2p's own threshold reads two environment
            # variables on every read (1.5 % of a talking node's CPU at 30 companions)
            if consumed > 0 and consumed >= min(self.target_recv_window // 2, CREDIT_BATCH):
                self.recv_window += consumed
                increment = consumed + self._apply_autotune_epoch(buffered)
        if increment > 0:
            await self.send_window_update(increment, skip_lock=True)


class _BatchingStreams(dict[int, YamuxStream]):
    """The muxer's stream table: a stream put in it becomes a :class:`BatchedYamuxStream`."""

    def __setitem__(self, key: int, stream: YamuxStream) -> None:
        if type(stream) is YamuxStream:
            stream.__class__ = BatchedYamuxStream
        super().__setitem__(key, stream)


def batch_window_updates(muxed_conn: Any) -> bool:
    """Make every stream of ``muxed_conn`` (a py-libp2p ``Yamux``; others are left alone) batch
    its window updates, those open now and those to come. Synchronous, so no stream can be
    added between the copy and the swap. ``True`` if the connection is Yamux."""
    if not isinstance(muxed_conn, Yamux):
        return False
    if not isinstance(muxed_conn.streams, _BatchingStreams):
        table = _BatchingStreams()
        for stream_id, stream in muxed_conn.streams.items():
            table[stream_id] = stream
        muxed_conn.streams = table
    return True
