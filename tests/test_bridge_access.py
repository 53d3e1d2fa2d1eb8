"""The Host, origin and token rules, and the WebSocket handshake checks, as pure functions."""

from __future__ import annotations

import pytest

from companion.bridge.access import (
    AccessPolicy,
    check_access,
    host_name,
    is_loopback,
    needs_token,
    token_from,
)
from companion.bridge.handshake import check_handshake

LOCAL = {"host": "127.0.0.1:8080"}


def test_a_local_client_without_origin_passes() -> None:
    assert check_access(AccessPolicy(), "/", LOCAL) is None
    assert check_access(AccessPolicy(), "/", {"host": "localhost:8080"}) is None
    assert check_access(AccessPolicy(), "/", {"host": "[::1]:8080"}) is None


def test_token_from_query_or_bearer() -> None:
    assert token_from("/?token=abc", {}) == "abc"
    assert token_from("/", {"authorization": "Bearer xyz"}) == "xyz"
    assert token_from("/", {"authorization": "Basic xyz"}) is None
    assert token_from("/", {}) is None


def test_token_required_when_set() -> None:
    policy = AccessPolicy(token="s3cret")
    missing = check_access(policy, "/", LOCAL)
    assert missing is not None and missing.status == 401 and "?token=" in missing.reason
    wrong = check_access(policy, "/?token=nope", LOCAL)
    assert wrong is not None and wrong.status == 401 and wrong.reason == "wrong token"
    assert check_access(policy, "/?token=s3cret", LOCAL) is None
    assert check_access(policy, "/", {**LOCAL, "authorization": "Bearer s3cret"}) is None
    assert check_access(policy, "/", LOCAL, token=False) is None  # the static page


def test_origin_rule() -> None:
    policy = AccessPolicy()
    assert check_access(policy, "/", {**LOCAL, "origin": "http://127.0.0.1:8080"}) is None
    assert check_access(policy, "/", {**LOCAL, "origin": "http://localhost:5173"}) is None
    assert check_access(policy, "/", {**LOCAL, "origin": "http://[::1]:3000"}) is None
    evil = check_access(policy, "/", {**LOCAL, "origin": "https://evil.example"})
    assert evil is not None and evil.status == 403 and "--allow-origin https://evil.example" in evil.reason
    assert check_access(policy, "/", {**LOCAL, "origin": "null"}) is not None
    allowed = AccessPolicy(allowed_origins=("https://app.example",))
    assert check_access(allowed, "/", {**LOCAL, "origin": "https://app.example"}) is None
    assert (
        check_access(AccessPolicy(allowed_origins=("*",)), "/", {**LOCAL, "origin": "https://x.example"})
        is None
    )


def test_dns_rebinding_is_refused_by_the_host_rule() -> None:
    """The attacker's page and its requests share the attacker's name: Origin matches Host."""
    rebinding = {"host": "evil.example:8080", "origin": "http://evil.example:8080"}
    denied = check_access(AccessPolicy(), "/", rebinding)
    assert denied is not None and denied.status == 421
    assert "--allow-host evil.example" in denied.reason
    # the page itself (no Origin on a navigation) is refused the same way
    page = check_access(AccessPolicy(), "/", {"host": "evil.example:8080"}, token=False)
    assert page is not None and page.status == 421
    # the token does not help: the Host rule comes first
    tokened = check_access(AccessPolicy(token="t"), "/?token=t", rebinding)
    assert tokened is not None and tokened.status == 421


def test_allowed_hosts_and_bound_addresses() -> None:
    lan = AccessPolicy(token="t", bind_host="192.168.1.5")
    assert check_access(lan, "/?token=t", {"host": "192.168.1.5:8080"}) is None
    assert check_access(lan, "/?token=t", {"host": "127.0.0.1:8080"}) is not None  # not where it listens
    named = AccessPolicy(allowed_hosts=("companion.example",))
    assert check_access(named, "/", {"host": "Companion.Example.:443"}) is None  # case, dot, port
    assert check_access(AccessPolicy(allowed_hosts=("*",)), "/", {"host": "any.example"}) is None
    wildcard = AccessPolicy(token="t", bind_host="0.0.0.0", machine_names=("mybox", "mybox.local"))
    for host in ("10.0.0.7:8080", "[fe80::1]:8080", "localhost:8080", "mybox.local:8080", "MYBOX"):
        assert check_access(wildcard, "/?token=t", {"host": host}) is None, host
    assert check_access(wildcard, "/?token=t", {"host": "evil.example:8080"}) is not None


@pytest.mark.parametrize("value", ["", "a b", "x/y", "user@host", "[::1", "[::1]x", "host:port", "[nope]:80"])
def test_malformed_host_headers_are_400(value: str) -> None:
    denied = check_access(AccessPolicy(), "/", {"host": value})
    assert denied is not None and denied.status == 400
    assert host_name(value) is None


def test_no_host_header_is_400() -> None:
    denied = check_access(AccessPolicy(), "/", {})
    assert denied is not None and denied.status == 400


def test_what_counts_as_loopback() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST", "app.localhost"):
        assert is_loopback(host) and not needs_token(host), host
    for host in ("0.0.0.0", "::", "192.168.1.5", "mybox", "localhost.example"):
        assert needs_token(host), host


KEY = "dGhlIHNhbXBsZSBub25jZQ=="
GOOD = {"host": "127.0.0.1:1", "upgrade": "websocket", "connection": "Upgrade", "sec-websocket-key": KEY}


def handshake(**changes: str | None) -> dict[str, str]:
    headers = {**GOOD, "sec-websocket-version": "13", **changes}
    return {k: v for k, v in headers.items() if v is not None}


def test_a_well_formed_handshake_passes() -> None:
    assert check_handshake("GET", "1.1", handshake()) is None
    assert (
        check_handshake("GET", "1.1", handshake(connection="keep-alive, Upgrade", upgrade="WebSocket"))
        is None
    )


@pytest.mark.parametrize(
    ("method", "version", "changes", "words"),
    [
        ("GET", "1.1", {"sec-websocket-key": "!!"}, "16 random bytes"),
        ("GET", "1.1", {"sec-websocket-key": "YWJj"}, "16 random bytes"),  # base64 of 3 bytes
        ("GET", "1.1", {"sec-websocket-key": f"{KEY}, {KEY}"}, "16 random bytes"),  # two keys
        ("GET", "1.1", {"sec-websocket-key": None}, "Sec-WebSocket-Key is missing"),
        ("GET", "1.1", {"sec-websocket-version": None}, "Sec-WebSocket-Version is missing"),
        ("GET", "1.1", {"sec-websocket-version": "thirteen"}, "not a number"),
        ("GET", "1.1", {"connection": "keep-alive"}, "Connection: Upgrade"),
        ("GET", "1.1", {"upgrade": "h2c, websocketx"}, "Upgrade: websocket"),
        ("POST", "1.1", {}, "GET"),
        ("GET", "1.0", {}, "HTTP/1.1"),
    ],
)
def test_malformed_handshakes_are_400(
    method: str, version: str, changes: dict[str, str | None], words: str
) -> None:
    refused = check_handshake(method, version, handshake(**changes))
    assert refused is not None and refused.status == 400 and words in refused.reason


def test_another_protocol_version_is_426_naming_ours() -> None:
    refused = check_handshake("GET", "1.1", handshake(**{"sec-websocket-version": "8"}))
    assert refused is not None and refused.status == 426
    assert ("Sec-WebSocket-Version", "13") in refused.headers
