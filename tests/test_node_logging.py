"""Bounded, throttled logs: what peers send ends up in log fields, so every field is cut to size
with a marker, repeats become one line with a count, and py-libp2p's records go the same way."""

from __future__ import annotations

import io
import json
import logging
import signal
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.network.stream.exceptions import StreamEOF, StreamReset  # (before any logging set-up)
from libp2p.peer.id import ID

from companion.app.stopping import note_stopping
from companion.log import (
    MAX_CHARS,
    MAX_ITEMS,
    MAX_TRACEBACK_CHARS,
    Throttle,
    bound,
    log_event,
    log_exception,
)
from support.logs import captured_logs
from support.nodes import running, until


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Logging configured as the command line does, into a buffer; put back as it was after."""
    with captured_logs("DEBUG") as stream:
        yield stream


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_strings_lists_and_dicts_are_cut_with_a_marker() -> None:
    assert bound("x" * 500) == "x" * MAX_CHARS + "…[+300 chars]"
    assert bound(list(range(50))) == [*range(MAX_ITEMS), "…[+30 items]"]
    cut = bound({f"k{n}": n for n in range(25)})
    assert len(cut) == MAX_ITEMS + 1 and cut["…"] == "+5 items"
    assert bound({"k" * 300: 1}) == {"k" * MAX_CHARS + "…[+100 chars]": 1}
    assert bound(("a", b"\x00" * 400)) == ["a", bound(repr(b"\x00" * 201))]
    assert bound(None) is None and bound(3.5) == 3.5 and bound(True) is True


def test_nesting_is_cut_and_odd_values_never_raise() -> None:
    deep: Any = "leaf"
    for _ in range(10):
        deep = [deep]
    assert bound(deep) == [[[["…[list of 1 items]"]]]]
    assert bound("\ud800 lone") == "\\ud800 lone"  # writable as UTF-8

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert bound(Broken()) == "<unprintable Broken: RuntimeError>"


def test_log_event_bounds_every_field(captured: io.StringIO) -> None:
    logger = logging.getLogger("companion.test")
    log_event(logger, "inbound", to=[f"companion_{n}" for n in range(1000)], text="y" * 70_000)
    (line,) = lines(captured)
    assert len(line["to"]) == MAX_ITEMS + 1 and line["to"][-1] == "…[+980 items]"
    assert len(line["text"]) < MAX_CHARS + 30
    assert len(captured.getvalue()) < 2000


def test_throttle_admits_one_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    throttle = Throttle(60.0, clock=lambda: now[0])
    assert throttle.admit("k") == 0
    assert [throttle.admit("k") for _ in range(5)] == [None] * 5
    assert throttle.admit("other") == 0
    assert throttle.suppressed() == 5
    now[0] = 61.0
    assert throttle.admit("k") == 5  # the summary: five left out since the last line
    assert throttle.suppressed() == 0


def test_throttle_forgets_the_oldest_keys_beyond_its_bound() -> None:
    throttle = Throttle(60.0, max_keys=3, clock=lambda: 0.0)
    for key in "abcd":
        throttle.admit(key)
    assert throttle.admit("a") == 0  # forgotten, so admitted again


def test_repeated_failures_log_one_bounded_traceback_a_minute(captured: io.StringIO) -> None:
    logger = logging.getLogger("companion.test")
    throttle = Throttle(60.0)
    for n in range(100):
        try:
            raise ValueError("z" * 10_000 + str(n))
        except ValueError as exc:
            log_exception(logger, "handler_failed", exc, throttle=throttle, peer="p" * 1000)
    (line,) = lines(captured)
    assert line["event"] == "handler_failed" and line["suppressed_since_last"] == 0
    assert len(line["traceback"]) <= MAX_TRACEBACK_CHARS + 40
    assert len(line["error"]) < MAX_CHARS + 30 and len(line["peer"]) < MAX_CHARS + 30
    assert throttle.suppressed() == 99


def test_libp2p_records_are_routed_bounded_and_throttled(captured: io.StringIO) -> None:
    library = logging.getLogger("libp2p.pubsub.pubsub")
    for n in range(50):
        library.warning("fail to deliver message to subscription for topic %s", "t" * 1000 + str(n))
    library.info("below the level: not shown")
    (line,) = lines(captured)
    assert line["event"] == "libp2p" and line["logger"] == "libp2p.pubsub.pubsub"
    assert line["message"].startswith("fail to deliver") and len(line["message"]) < MAX_CHARS + 30
    assert line["suppressed_since_last"] == 0


def test_a_dht_request_stream_the_peer_ended_is_not_a_warning(captured: io.StringIO) -> None:
    """py-libp2p 0.8.1's DHT server warns when a peer half-closes its request stream after the
    answer (every lookup of a demo did): that end is routine; a real read failure still shows."""
    dht = logging.getLogger("libp2p.kad_dht.kad_dht")
    logging.getLogger("libp2p").setLevel(logging.INFO)
    dht.warning("Failed to read DHT message from stream: %s", StreamEOF())
    dht.warning("Failed to read DHT message from stream: %s", StreamReset("reset by the peer"))
    (line,) = lines(captured)
    assert line["event"] == "libp2p" and "reset by the peer" in line["message"]

    logging.getLogger("libp2p").setLevel(logging.DEBUG)  # asked for everything: shown as it is
    dht.warning("Failed to read DHT message from stream: %s", StreamEOF())
    assert len(lines(captured)) == 2


def test_a_dht_peer_that_just_left_is_not_a_warning(captured: io.StringIO) -> None:
    """py-libp2p 0.8.1's DHT warns when a lookup still asks a peer that left and when the
    request it was answering is reset (the demo's stop printed one or two in 5 of 6 runs): a
    peer leaving is routine; a malformed request or another failure still shows."""
    lookup = logging.getLogger("libp2p.kad_dht.peer_routing")
    server = logging.getLogger("libp2p.kad_dht.kad_dht")
    logging.getLogger("libp2p").setLevel(logging.INFO)
    peer = "12D3KooWCJ9nEQ8WMuZVj9542j73mxbwukX6wf9drTuyH49HPXxC"
    lookup.warning(f"Failed to open stream to {peer}: No valid connections available for peer {peer}")
    lookup.warning(f"Failed to open stream to {peer}: failed to open a stream to peer {peer}")
    server.warning(f"Failed to parse protobuf message: {StreamReset()}")
    assert lines(captured) == []

    server.warning("Failed to parse protobuf message: Error parsing message with type 'Message'")
    lookup.warning(f"Failed to open stream to {peer}: failed to negotiate the protocol")
    other = "12D3KooWC21k99fSdJvwPVpygZhhXjyJvbxsSir2fqRf7sTMHoNr"
    logging.getLogger("libp2p.kad_dht.routing_table").warning(
        f"Failed to open stream to {peer}: No valid connections available for peer {other}"
    )
    shown = [line["message"] for line in lines(captured)]
    assert len(shown) == 3 and "Error parsing" in shown[0] and "negotiate" in shown[1]

    logging.getLogger("libp2p").setLevel(logging.DEBUG)  # asked for everything: shown as it is
    server.warning(f"Failed to parse protobuf message: {StreamReset()}")
    assert len(lines(captured)) == 4


def test_a_peer_without_the_metadata_protocol_is_not_an_error(captured: io.StringIO) -> None:
    """py-libp2p 0.8.1 logs every stream it could not open at ERROR level; every ``run --ws``
    start printed one (a companion asks the clients' node, which has no metadata). Our code
    reports those itself (``peer_metadata_unavailable``); other protocols' failures still show."""
    import companion.node.metadata  # noqa: F401  (registers the protocol it reports itself)

    host = logging.getLogger("libp2p.host.basic_host")
    logging.getLogger("libp2p").setLevel(logging.INFO)
    for protocol in ("/aikyo/metadata/1.0.0", "/ipfs/ping/1.0.0"):
        host.error(
            f"Failed to open stream to peer 12D3KooWX:\n  Error: protocols not supported: tried"
            f" ['{protocol}'], timeout=10s.\n  Protocols: ['{protocol}']\n  Timeout: 30s"
        )
    (line,) = lines(captured)
    assert "/ipfs/ping/1.0.0" in line["message"]


def test_libp2p_records_stay_bounded_in_a_command_that_runs_a_node() -> None:
    """py-libp2p clears its logger's handlers when first imported: the set-up every node command
    uses must still catch the library's warnings, bounded, in a process that starts fresh."""
    import subprocess
    import sys

    code = (
        "import logging, sys\n"
        "assert 'libp2p' not in sys.modules\n"
        "from companion.app.logs import configure_node_logging\n"
        "configure_node_logging('INFO', 'json')\n"
        "import libp2p.kad_dht.kad_dht\n"
        "logging.getLogger('libp2p.kad_dht.kad_dht').warning('peer said %s', 'x' * 5000)\n"
    )
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    (line,) = [json.loads(text) for text in done.stderr.splitlines()]
    assert line["event"] == "libp2p" and len(line["message"]) < 1000


async def test_a_dial_that_fails_is_reported_by_the_code_that_dialled(captured: io.StringIO) -> None:
    """py-libp2p 0.8.1's TCP transport logs every failed dial at ERROR level and raises it to
    the dialler (stopping 10 companions together printed two, for peers that had just left).
    A node bootstrapped to a closed port says so itself: ``bootstrap_dial_failed`` with the
    address's own error (py-libp2p's swarm keeps it only in the chained causes), a WARNING the
    first time and INFO for the retries; no libp2p record is printed."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    nobody = ID.from_pubkey(create_new_key_pair().public_key)
    peer = f"/ip4/127.0.0.1/tcp/{port}/p2p/{nobody}"
    async with trio.open_nursery() as nursery:
        async with running(nursery, None, peers=[peer], dht=False, redial_initial=0.05):
            await until(lambda: len(_events(captured, "bootstrap_dial_failed")) >= 3, 10)
        nursery.cancel_scope.cancel()
    failed = _events(captured, "bootstrap_dial_failed")
    assert [line["level"] for line in failed[:3]] == ["warning", "info", "info"], failed
    assert "Connection refused" in failed[0]["error"], failed  # the cause, not "unable to connect"
    assert failed[0]["addrs"] == [f"/ip4/127.0.0.1/tcp/{port}"]
    assert [line for line in lines(captured) if line["event"] == "libp2p"] == []
    assert [line for line in lines(captured) if line["level"] in ("error", "warning")] == failed[:1]


def _events(stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    return [line for line in lines(stream) if line.get("event") == event]


def test_the_libraries_teardown_is_left_out_once_the_process_stops(captured: io.StringIO) -> None:
    """Stopping 30 companions together printed 44 py-libp2p ERRORs (handshakes cut short,
    ``add_conn failed ... Cancelled``, a stream reset by a peer stopping too). Once the process
    is stopping they are its own teardown; the nodes' events still show."""
    logging.getLogger("libp2p").setLevel(logging.INFO)
    yamux = logging.getLogger("libp2p.stream_muxer.yamux.yamux")
    yamux.error("Error in handle_incoming for peer X: ConnectionClosedError: reset by remote peer")
    assert len(lines(captured)) == 1  # while running it shows

    note_stopping(logging.getLogger("companion.app.run"), signal.SIGTERM)
    yamux.error("Error in handle_incoming for peer Y: ConnectionClosedError: reset by remote peer")
    logging.getLogger("libp2p.network.swarm").warning("[ADDCONN_FAIL] add_conn failed: Cancelled")
    log_event(logging.getLogger("companion.node"), "host_close_timeout", logging.WARNING, node="n")
    assert [(line["event"], line.get("signal")) for line in lines(captured)[1:]] == [
        ("stopping", "SIGTERM"),
        ("host_close_timeout", None),
    ]

    logging.getLogger("libp2p").setLevel(logging.DEBUG)  # asked for everything: shown as it is
    yamux.error("Error in handle_incoming for peer Z")
    assert lines(captured)[-1]["event"] == "libp2p"
