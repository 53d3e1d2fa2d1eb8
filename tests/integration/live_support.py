"""A live companion network for client tests: companions with the conversation engine (each its
own process, offline scripted model) and a bridge, all on 127.0.0.1."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from bridge_support import start_bridge
from network_support import Network, Proc

CARD = """\
metadata:
  id: companion_{key}
  name: {name}
  personality: {personality}
  story: {name} lives on 127.0.0.1 and likes short conversations.
  sample: "{sample}"
role: Keep replies to one or two sentences.
actions: [{tool}]
events:
  params:
    type: object
    properties:
      mood:
        type: string
        enum: [calm, curious]
    required: [mood]
  conditions:
    - expression: "true"
      execute:
        - tool: {tool}
          instruction: Reply briefly to what was just said.
"""


@dataclass
class Live:
    bridge: Proc
    port: int
    companions: dict[str, Proc]


def write_card(directory: Path, key: str, name: str, tool: str) -> Path:
    path = directory / f"{key}.yaml"
    text = CARD.format(
        key=key, name=name, tool=tool, personality="warm and curious", sample=f"Hello, I am {name}."
    )
    path.write_text(text, encoding="utf-8")
    return path


def start_companion(
    net: Network, key: str, name: str, tool: str, *peers: str, seed: int = 0
) -> tuple[Proc, str]:
    """One companion with the engine (``companion run``, scripted model); returns its address."""
    card = write_card(net.tmp, key, name, tool)
    argv = [
        sys.executable,
        "-m",
        "companion.cli.run",
        str(card),
        "--no-mdns",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--data-dir",
        str(net.tmp / f"data-{key}"),
        "--seed",
        str(seed),
        "--log-format",
        "json",
    ]
    for peer in peers:
        argv += ["--peer", peer]
    proc = Proc(key, argv)
    net.procs.append(proc)
    started = proc.event("started", 30)
    return proc, started["addrs"][0]


def start_live(net: Network) -> Live:
    """Two companions — Juniper answers through ``speak_with_voice`` (a speak query first), Pim
    through ``speak`` — and a bridge that knows both."""
    juniper, j_addr = start_companion(net, "juniper", "Juniper", "speak_with_voice", seed=1)
    pim, p_addr = start_companion(net, "pim", "Pim", "speak", j_addr, seed=2)
    bridge, port, _ = start_bridge(net, "bridge", j_addr, p_addr)
    for key in ("juniper", "pim"):
        bridge.event("companion_joined", 30, companion_id=f"companion_{key}")
    juniper.event("companion_joined", 30, companion_id="companion_pim")
    return Live(bridge, port, {"juniper": juniper, "pim": pim})
