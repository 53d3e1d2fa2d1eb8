"""The token and origin rules."""

from __future__ import annotations

from companion.bridge.access import AccessPolicy, check_access, token_from


def test_no_token_no_origin_passes() -> None:
    assert check_access(AccessPolicy(), "/", {}) is None


def test_token_from_query_or_bearer() -> None:
    assert token_from("/?token=abc", {}) == "abc"
    assert token_from("/", {"authorization": "Bearer xyz"}) == "xyz"
    assert token_from("/", {"authorization": "Basic xyz"}) is None
    assert token_from("/", {}) is None


def test_token_required_when_set() -> None:
    policy = AccessPolicy(token="s3cret")
    missing = check_access(policy, "/", {})
    assert missing is not None and missing.status == 401 and "token" in missing.reason
    wrong = check_access(policy, "/?token=nope", {})
    assert wrong is not None and wrong.status == 401
    assert check_access(policy, "/?token=s3cret", {}) is None
    assert check_access(policy, "/", {"authorization": "Bearer s3cret"}) is None


def test_origin_rule() -> None:
    policy = AccessPolicy()
    host = {"host": "127.0.0.1:8080"}
    assert check_access(policy, "/", {**host, "origin": "http://127.0.0.1:8080"}) is None
    assert check_access(policy, "/", {**host, "origin": "http://localhost:5173"}) is None
    assert check_access(policy, "/", {**host, "origin": "http://[::1]:3000"}) is None
    evil = check_access(policy, "/", {**host, "origin": "https://evil.example"})
    assert evil is not None and evil.status == 403 and "--allow-origin https://evil.example" in evil.reason
    assert check_access(policy, "/", {**host, "origin": "null"}) is not None
    allowed = AccessPolicy(allowed_origins=("https://app.example",))
    assert check_access(allowed, "/", {**host, "origin": "https://app.example"}) is None
    assert check_access(AccessPolicy(allowed_origins=("*",)), "/", {"origin": "https://x.example"}) is None


def test_origin_is_checked_before_token() -> None:
    policy = AccessPolicy(token="t")
    denied = check_access(policy, "/?token=t", {"host": "h:1", "origin": "https://evil.example"})
    assert denied is not None and denied.status == 403
