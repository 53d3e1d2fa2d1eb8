"""Networks built from Linux network namespaces, for tests of companions on different networks.

:class:`Topology` makes one "internet" (a bridge in its own namespace, TEST-NET-3 addresses,
203.0.113.0/24, which are never routed outside: nothing here can reach the machine's own network)
and attaches to it public hosts and homes. A home is a router namespace (its WAN address on the
internet, a LAN behind it, nftables masquerade and a stateful firewall that drops every
unsolicited inbound packet, as home routers do) and one host namespace on that LAN.

- ``nat="cone"``: the router keeps the source port when it can (Linux masquerade): hole
  punching by TCP simultaneous open can work.
- ``nat="symmetric"``: a new random port per connection (``masquerade fully-random``, as
  carrier-grade NATs do): the port a peer predicts is wrong and hole punching fails.

Processes start inside a namespace with ``ip netns exec`` (which execs, so the PID is the
program's) and are stopped by PID; :meth:`Topology.close` deletes every namespace it made (their
veth pairs go with them), also after a failure. :func:`unavailable` says why the machine cannot
run this (not root, no ``ip``, namespaces refused, no nftables) so tests can skip.

Run as a script inside a namespace (``python netns.py client ...``) it is the test's
client: a non-companion node that opens a conversation and prints what it hears.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

NatKind = Literal["cone", "symmetric"]

HERE_FILE = Path(__file__).resolve()
"""This file: run inside a namespace as the test's client (``python netns.py client``)."""

INTERNET_PREFIX = "203.0.113"
"""TEST-NET-3 (RFC 5737): documentation addresses, used only inside the test's namespaces."""


def _run(*argv: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check)


def ensure_nft() -> str | None:
    """``nft`` on the PATH, installing Debian's nftables package as root when missing; else why not."""
    if shutil.which("nft"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "nftables (nft) is not installed and cannot be installed here (needs root and apt-get)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "nftables"]):
        subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, check=False)
    return None if shutil.which("nft") else "apt-get could not install nftables"


def unavailable() -> str | None:
    """Why namespaces with NAT cannot be built on this machine, or ``None`` when they can."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if not shutil.which("ip"):
        return "iproute2 (ip) is not installed"
    probe = f"cnx-probe-{secrets.token_hex(3)}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add was refused: {made.stderr.strip()[:200]}"
    try:
        reason = ensure_nft()
        if reason:
            return reason
        table = _run("ip", "netns", "exec", probe, "nft", "add", "table", "ip", "probe", check=False)
        if table.returncode != 0:
            return f"nftables refused inside a namespace: {table.stderr.strip()[:200]}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class Home:
    """A router (WAN on the internet, LAN behind NAT) and one host on the LAN."""

    name: str
    router: str
    host: str
    wan_ip: str
    lan_prefix: str
    nat: NatKind

    @property
    def host_ip(self) -> str:
        return f"{self.lan_prefix}.10"


@dataclass
class Topology:
    """The namespaces of one test; every name starts with a random prefix."""

    prefix: str = field(default_factory=lambda: f"cx{secrets.token_hex(2)}")
    namespaces: list[str] = field(default_factory=list)
    homes: dict[str, Home] = field(default_factory=dict)
    public: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Name -> (namespace, address) of hosts directly on the internet."""
    _next_wan: int = 20

    def _ns(self, role: str) -> str:
        name = f"{self.prefix}-{role}"
        _run("ip", "netns", "add", name)
        self.namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def exec(self, ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", ns, *argv)

    def _sysctl(self, ns: str, key: str, value: str) -> None:
        self.exec(ns, "sysctl", "-qw", f"{key}={value}")

    @property
    def internet(self) -> str:
        return f"{self.prefix}-inet"

    def build_internet(self) -> None:
        ns = self._ns("inet")
        _run("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", ns, "link", "set", "br0", "up")
        self._sysctl(ns, "net.ipv4.ip_forward", "0")  # a switch: addresses nobody routes get lost

    def _attach(self, ns: str, port: str, ip: str) -> None:
        """A veth from ``ns`` (``wan0``, ``ip``/24) to the internet's bridge (``port``)."""
        _run(
            "ip",
            "-n",
            self.internet,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "wan0",
            "netns",
            ns,
        )
        _run("ip", "-n", self.internet, "link", "set", port, "master", "br0", "up")
        _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "wan0")
        _run("ip", "-n", ns, "link", "set", "wan0", "up")

    def add_public(self, name: str, last_octet: int) -> tuple[str, str]:
        """A host with a public address (a relay on a rented machine)."""
        ns = self._ns(name)
        ip = f"{INTERNET_PREFIX}.{last_octet}"
        self._attach(ns, f"p-{name}"[:15], ip)
        self.public[name] = (ns, ip)
        return ns, ip

    def add_home(self, name: str, lan_prefix: str, nat: NatKind) -> Home:
        router = self._ns(f"{name}r")
        host = self._ns(f"{name}h")
        wan_ip = f"{INTERNET_PREFIX}.{self._next_wan}"
        self._next_wan += 1
        self._attach(router, f"h-{name}"[:15], wan_ip)
        _run("ip", "-n", router, "link", "add", "lan0", "type", "veth", "peer", "name", "lan0", "netns", host)
        _run("ip", "-n", router, "addr", "add", f"{lan_prefix}.1/24", "dev", "lan0")
        _run("ip", "-n", router, "link", "set", "lan0", "up")
        _run("ip", "-n", host, "addr", "add", f"{lan_prefix}.10/24", "dev", "lan0")
        _run("ip", "-n", host, "link", "set", "lan0", "up")
        _run("ip", "-n", host, "route", "add", "default", "via", f"{lan_prefix}.1")
        _run("ip", "-n", router, "route", "add", "default", "via", f"{INTERNET_PREFIX}.1", check=False)
        self._sysctl(router, "net.ipv4.ip_forward", "1")
        mapping = "masquerade fully-random" if nat == "symmetric" else "masquerade"
        ruleset = f"""
table ip nat {{
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        oifname "wan0" {mapping}
    }}
}}
table inet filter {{
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "wan0" ct state established,related accept
        iifname "wan0" drop
    }}
    chain forward {{
        type filter hook forward priority filter; policy drop;
        ct state established,related accept
        iifname "lan0" oifname "wan0" accept
    }}
}}
"""
        subprocess.run(
            ["ip", "netns", "exec", router, "nft", "-f", "-"],
            input=ruleset,
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        home = Home(name, router, host, wan_ip, lan_prefix, nat)
        self.homes[name] = home
        return home

    def conntrack(self, home: str) -> str:
        """The router's NAT table as nft sees it (for failure messages)."""
        out = _run("ip", "netns", "exec", self.homes[home].router, "nft", "list", "ruleset", check=False)
        return out.stdout

    def close(self) -> list[str]:
        """Delete every namespace this topology made; returns the ones that would not go."""
        left = []
        for ns in reversed(self.namespaces):
            if _run("ip", "netns", "del", ns, check=False).returncode != 0:
                left.append(ns)
        existing = set(_run("ip", "netns", "list", check=False).stdout.split())
        return [ns for ns in self.namespaces if ns in existing] + left


def in_namespace(ns: str, *argv: str) -> list[str]:
    """``argv`` run inside ``ns`` (``ip netns exec`` execs it: the PID stays the program's)."""
    return ["ip", "netns", "exec", ns, *argv]


# --- the client, run inside a namespace --------------------------------------------------------


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def _client(peer: str, to: list[str], text: str, wait: float) -> None:
    """Join through ``peer`` (only: no DHT), wait until a companion is in its directory (or
    ``wait`` passed), open the conversation with ``to`` and print each message heard (the
    companions behind other NATs are reached through ``peer``'s gossipsub mesh)."""
    import trio

    from companion.memory import Inbound
    from companion.node import CompanionNode, NodeConfig
    from companion.protocol import MESSAGES, Message

    class Printer:
        async def handle(self, inbound: Inbound) -> None:
            payload = inbound.payload
            if isinstance(payload, Message):
                p = payload.params
                _emit(
                    "message", sender=p.from_, to=p.to, id=p.id, text=p.message[:200], at=trio.current_time()
                )

    node = CompanionNode(
        None, NodeConfig(listen=("/ip4/127.0.0.1/tcp/0",), peers=(peer,), name="client", dht=False)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run, Printer())
        _emit("started", peer_id=node.peer_id)
        seen = await node.wait_for(lambda: bool(set(to) & set(node.directory)), wait)
        _emit("directory", companions=sorted(node.directory), complete=seen)
        opening = Message.create("user_netns", to, text)
        for _attempt in range(20):  # the same id each time: companions answer once
            await node.publish(MESSAGES, opening)
            _emit("published", id=opening.params.id, at=trio.current_time())
            await trio.sleep(2.0)
        await trio.sleep_forever()


def main(argv: list[str]) -> int:
    import argparse

    import trio

    from companion.log import configure_logging

    parser = argparse.ArgumentParser(prog="netns.py")
    sub = parser.add_subparsers(dest="command", required=True)
    client = sub.add_parser("client")
    client.add_argument("--peer", required=True)
    client.add_argument("--to", required=True, help="comma-separated companion ids")
    client.add_argument("--text", default="Hello everyone, across the internet!")
    client.add_argument("--wait", type=float, default=60.0)
    args = parser.parse_args(argv)
    configure_logging("WARNING", "json")
    try:
        trio.run(_client, args.peer, args.to.split(","), args.text, args.wait)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main(sys.argv[1:]))
