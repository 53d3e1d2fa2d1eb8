"""Benchmark the WebRTC voice: time from a speak query to the first audio frame, and CPU per session.

The bridge (with its WebRTC gateway and espeak-ng) runs in this process on 127.0.0.1, on an
in-memory network with a stand-in companion that publishes ``speak`` queries. The clients are
aiortc peers in a child process (so their decoding is not counted as the bridge's CPU); they
report when each query's first audible frame arrived. CLOCK_MONOTONIC is shared by both
processes, so the latencies are end to end: query published -> audio decoded by the client.

    python scripts/bench_voice.py [--sessions 4] [--rounds 10] [--idle 5]

Prints a JSON summary (and a readable table on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import trio

from companion.bridge import Bridge, BridgeConfig
from companion.memory import MemoryEndpoint, MemoryHub
from companion.protocol import QUERIES, Query, QueryResult
from companion.rtc import RtcGateway, SessionSettings, connect_rtc
from companion.rtc.route import OFFER_PATH, offer_route
from companion.voice import EspeakSynthesizer

LINE = "Good morning! The weather is lovely today, shall we go for a walk?"
AUDIBLE = 500  # peak sample value that counts as sound


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- the client process ------------------------------------------------------------------------


async def run_clients(url: str, sessions: int, seconds: float) -> None:
    """Connect ``sessions`` voice clients; print the first audible frame time per speak query."""
    out = trio.open_memory_channel[dict[str, Any]](1000)

    async def one(index: int) -> None:
        async with connect_rtc(url, voice=True) as client:
            await out[0].send({"event": "connected", "client": index, "session": client.session_id})
            speaking: str | None = None
            async with trio.open_nursery() as nursery:

                async def frames() -> None:
                    nonlocal speaking
                    while True:
                        frame = json.loads(await client.receive_text())
                        if frame.get("method") == "query.send" and frame["params"]["type"] == "speak":
                            speaking = frame["id"]

                nursery.start_soon(frames)
                async for audio in client.audio:
                    if speaking is not None and audio.peak > AUDIBLE:
                        await out[0].send(
                            {"event": "audio", "client": index, "query": speaking, "at": audio.received_at}
                        )
                        speaking = None

    async def printer() -> None:
        async for item in out[1]:
            print(json.dumps(item), flush=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(printer)
        with trio.move_on_after(seconds):
            async with trio.open_nursery() as clients:
                for i in range(sessions):
                    clients.start_soon(one, i)
        nursery.cancel_scope.cancel()
    print(json.dumps({"event": "done", "cpu": cpu_seconds()}), flush=True)


# --- the bridge process ------------------------------------------------------------------------


async def next_result(companion: MemoryEndpoint, query_id: str, timeout: float = 30) -> QueryResult:
    with trio.fail_after(timeout):
        async for inbound in companion.receive_channel:
            if isinstance(inbound.payload, QueryResult) and inbound.payload.id == query_id:
                return inbound.payload
    raise RuntimeError("network closed")


async def bench(sessions: int, rounds: int, idle: float) -> dict[str, Any]:
    hub = MemoryHub()
    companion = hub.endpoint("companion")
    node = hub.endpoint("bridge")
    bridge = Bridge(node, config=BridgeConfig(port=0))
    synth = EspeakSynthesizer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bridge.pump, node.receive_channel)
        async with RtcGateway(bridge, node, synthesizer=synth, settings=SessionSettings()) as gw:
            bridge.add_route(OFFER_PATH, offer_route(gw))
            port = await nursery.start(bridge.serve)
            url = f"http://127.0.0.1:{port}"
            budget = 60 + idle * 2 + rounds * 15
            argv = [
                sys.executable,
                __file__,
                "--client",
                url,
                "--sessions",
                str(sessions),
                "--seconds",
                str(budget),
            ]
            audio_at: dict[str, list[float]] = {}
            client_cpu: list[float] = []
            connected = trio.Event()
            count = 0

            proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE)
            try:

                async def read_client() -> None:
                    nonlocal count
                    assert proc.stdout is not None
                    buffer = b""
                    async for chunk in proc.stdout:
                        buffer += chunk
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            item = json.loads(line)
                            if item["event"] == "connected":
                                count += 1
                                if count == sessions:
                                    connected.set()
                            elif item["event"] == "audio":
                                audio_at.setdefault(item["query"], []).append(item["at"])
                            elif item["event"] == "done":
                                client_cpu.append(item["cpu"])

                nursery.start_soon(read_client)
                with trio.fail_after(60):
                    await connected.wait()
                await trio.sleep(1)  # let every track reach its steady pace

                # idle: sessions connected, streaming silence
                wall0, cpu0 = time.monotonic(), cpu_seconds()
                await trio.sleep(idle)
                idle_cpu = (cpu_seconds() - cpu0) / (time.monotonic() - wall0)

                # speaking: one line after another, each waited for (paced by its audio)
                latencies: list[float] = []
                wall0, cpu0 = time.monotonic(), cpu_seconds()
                for _ in range(rounds):
                    query = Query.create("companion_bench", "speak", {"message": LINE, "emotion": "neutral"})
                    sent = time.monotonic()
                    await companion.publish(QUERIES, query)
                    await next_result(companion, query.id)
                    with trio.fail_after(5):
                        while len(audio_at.get(query.id, [])) < sessions:
                            await trio.sleep(0.01)
                    latencies += [at - sent for at in audio_at[query.id]]
                speak_wall = time.monotonic() - wall0
                speak_cpu = (cpu_seconds() - cpu0) / speak_wall
                server_latencies = [x for s in gw.sessions.values() for x in s.stats.speak_latencies]
            finally:
                proc.terminate()
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    await proc.wait()
            nursery.cancel_scope.cancel()

    def ms(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {
            "median": round(statistics.median(ordered) * 1000, 1),
            "p95": round(ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1000, 1),
            "max": round(ordered[-1] * 1000, 1),
        }

    return {
        "sessions": sessions,
        "rounds": rounds,
        "line_chars": len(LINE),
        "cpu_count": os.cpu_count(),
        "first_audio_ms_end_to_end": ms(latencies),
        "first_frame_ms_in_bridge": ms(server_latencies),
        "bridge_cpu_percent_per_session_idle": round(idle_cpu * 100 / sessions, 2),
        "bridge_cpu_percent_per_session_speaking": round(speak_cpu * 100 / sessions, 2),
        "bridge_cpu_percent_total_speaking": round(speak_cpu * 100, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle measurement")
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=120, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        trio.run(run_clients, args.client, args.sessions, args.seconds)
        return 0
    if not EspeakSynthesizer.available():
        print("bench_voice: espeak-ng is not installed (scripts/system-deps.sh installs it)", file=sys.stderr)
        return 2
    result = trio.run(bench, args.sessions, args.rounds, args.idle)
    print(json.dumps(result, indent=2))
    e2e, bridge = result["first_audio_ms_end_to_end"], result["first_frame_ms_in_bridge"]
    print(
        f"speak query -> first audio at the client: median {e2e['median']} ms, p95 {e2e['p95']} ms\n"
        f"speak query -> first frame sent by the bridge: median {bridge['median']} ms\n"
        f"bridge CPU per session: idle {result['bridge_cpu_percent_per_session_idle']} %, "
        f"speaking {result['bridge_cpu_percent_per_session_speaking']} % "
        f"({args.sessions} sessions, {os.cpu_count()} CPUs)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
