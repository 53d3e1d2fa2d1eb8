"""ActionContext.store: a tool's JSON memory, durable in the companion's SQLite file, bounded."""

from __future__ import annotations

import os
import sqlite3
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from companion.actions import (
    ActionContext,
    ActionDef,
    ErrorCode,
    KeyValueStore,
    StoreLimitExceeded,
    StoreLimits,
    action,
)
from companion.protocol import Action, Message
from companion.store.kv import KV_TABLE
from companion.store.sqlite import DB_FILENAME, Store
from support.actions import ME, OTHER, make_runtime, put
from support.processes import killed_after


class Empty(BaseModel):
    pass


def _counter(id: str = "count") -> ActionDef:
    @action(id=id, description="Count calls.", input=Empty, timeout=5)
    def count(ctx: ActionContext[Empty]) -> Action:
        n = int(ctx.store.get("calls", 0)) + 1
        ctx.store.set("calls", n)
        return Action.create(ctx.companion_id, "count", {"n": n})

    return count


@pytest.fixture
def kv_file(tmp_path: Path) -> Path:
    return tmp_path / "data" / DB_FILENAME


@pytest.fixture
def kv(kv_file: Path) -> Iterator[KeyValueStore]:
    with KeyValueStore.open(kv_file) as store:
        yield store


# --- durable ----------------------------------------------------------------------------------------


async def test_values_survive_closing_and_reopening_the_file(kv_file: Path) -> None:
    for expected in (1, 2, 3):
        with KeyValueStore.open(kv_file) as kv:
            runtime, recorder = make_runtime(_counter(), kv=kv)
            assert (await runtime.call("count", {})).ok
        [sent] = recorder.sent
        assert isinstance(sent[1], Action) and sent[1].params.params == {"n": expected}


_WRITER = textwrap.dedent(
    """
    import sys, time
    import trio
    from support.actions import make_runtime
    from support.actions import put
    from companion.actions import KeyValueStore
    kv = KeyValueStore.open(sys.argv[1])
    if sys.argv[2] == "call":  # a tool writes; its call returns
        runtime, _ = make_runtime(put, kv=kv)
        result = trio.run(runtime.call, "put", {"key": "greeted", "value": {"companion_b": 2}})
        assert result.ok, result
    else:  # the API outside a runtime: set, then sync
        kv.namespace("companion_a", "put").set("greeted", {"companion_b": 2})
        assert kv.sync(10)
    print("written", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("how", ["call", "sync"])
def test_a_returned_write_survives_the_process_being_killed(kv_file: Path, how: str) -> None:
    """The writer is killed with SIGKILL right after the tool's call returned (or ``sync`` did):
    no close. The write was committed off the loop, with ``synchronous=FULL``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    with killed_after(_WRITER, str(kv_file), how, says="written", env=env):
        pass
    with KeyValueStore.open(kv_file) as kv:
        assert kv.namespace("companion_a", "put").get("greeted") == {"companion_b": 2}


def test_it_shares_the_companions_sqlite_file_with_the_store(kv_file: Path) -> None:
    message = Message.create(ME.id, [OTHER.id], "hi")
    with Store(kv_file) as store, KeyValueStore.open(kv_file) as kv:
        store.append(message)
        kv.namespace(ME.id, "greet").set("last", "companion_b")
    # Both reopen cleanly: the store's schema check does not trip over the extra table.
    with Store(kv_file) as store, KeyValueStore.open(kv_file) as kv:
        assert store.recent(5) == [message]
        assert kv.namespace(ME.id, "greet").get("last") == "companion_b"


def test_a_connection_can_be_given_and_stays_open(kv_file: Path) -> None:
    kv_file.parent.mkdir(parents=True)
    conn = sqlite3.connect(kv_file, isolation_level=None)
    with KeyValueStore.open(conn) as kv:
        kv.namespace(ME.id, "t").set("k", [1, 2])
    assert conn.execute(f"SELECT value FROM {KV_TABLE}").fetchone() == ("[1,2]",)
    conn.close()


# --- namespaces -----------------------------------------------------------------------------------


async def test_each_tool_sees_only_its_own_namespace(kv: KeyValueStore) -> None:
    runtime, _ = make_runtime(_counter("one"), _counter("two"), kv=kv)
    for _ in range(3):
        await runtime.call("one", {})
    await runtime.call("two", {})
    assert kv.namespace(ME.id, "one").get("calls") == 3
    assert kv.namespace(ME.id, "two").get("calls") == 1
    assert kv.namespace(OTHER.id, "one").get("calls") is None  # another companion, same file


def test_companions_and_namespaces_are_isolated_in_one_file(kv: KeyValueStore) -> None:
    a, b, c = kv.namespace(ME.id, "t"), kv.namespace(OTHER.id, "t"), kv.namespace(ME.id, "u")
    a.set("k", 1)
    b.set("k", 2)
    assert (a.get("k"), b.get("k"), c.get("k", "none")) == (1, 2, "none")
    assert a.delete("k") and not a.delete("k")
    assert b.get("k") == 2 and a.keys() == [] and b.keys() == ["k"]


# --- JSON values ----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [KeyValueStore.in_memory, None], ids=["memory", "sqlite"])
def test_values_are_json_and_reads_are_copies(make: Any, kv: KeyValueStore) -> None:
    space = (make() if make else kv).namespace(ME.id, "t")
    space.set("d", {"list": [1, 2.5, "x", None, True]})
    got = space.get("d")
    got["list"].append("mutated")
    assert space.get("d") == {"list": [1, 2.5, "x", None, True]}
    assert "d" in space and "e" not in space and len(space) == 1 and list(space) == ["d"]
    for bad in (float("nan"), {1, 2}, object(), {"k": float("inf")}):
        with pytest.raises(ValueError, match="not JSON"):
            space.set("bad", bad)
    assert "bad" not in space
    with pytest.raises(TypeError, match="non-empty string"):
        space.set("", 1)


async def test_a_non_json_value_is_a_handler_bug() -> None:
    runtime, _ = make_runtime(put)
    result = await runtime.call("put", {"key": "k", "value": 1})
    assert result.ok

    @action(id="bad", description="Keeps a set.", input=Empty, timeout=5)
    def bad(ctx: ActionContext[Empty]) -> list[Action]:
        ctx.store.set("k", {1, 2})
        return []

    runtime.register(bad)
    assert (await runtime.call("bad", {})).status == "internal_error"


def test_an_unreadable_row_reads_as_missing(kv_file: Path) -> None:
    with KeyValueStore.open(kv_file) as kv:
        kv.namespace(ME.id, "t").set("k", 1)
    with sqlite3.connect(kv_file) as conn:  # damaged between two runs
        conn.execute(f"UPDATE {KV_TABLE} SET value = '{{broken'")
    with KeyValueStore.open(kv_file) as kv:
        assert kv.namespace(ME.id, "t").get("k", "default") == "default"


# --- limits ---------------------------------------------------------------------------------------

SMALL = StoreLimits(max_key_chars=8, max_value_bytes=20, max_namespace_keys=3, max_namespace_bytes=40)


@pytest.mark.parametrize("make", ["memory", "sqlite"])
def test_every_limit_refuses_the_write_and_keeps_what_was_there(make: str, kv_file: Path) -> None:
    store = (
        KeyValueStore.in_memory(limits=SMALL)
        if make == "memory"
        else KeyValueStore.open(kv_file, limits=SMALL)
    )
    space = store.namespace(ME.id, "t")
    with pytest.raises(StoreLimitExceeded, match="the key's length") as info:
        space.set("k" * 9, 1)
    assert info.value.code == ErrorCode.STORE_LIMIT and info.value.limit == 8
    with pytest.raises(StoreLimitExceeded, match=r"value's size in bytes .* would be 22 \(limit 20\)"):
        space.set("big", "x" * 20)  # 22 bytes with the quotes
    space.set("a", "x" * 10)  # 1 + 12 bytes
    space.set("b", "x" * 10)
    with pytest.raises(StoreLimitExceeded, match="namespace's size in bytes"):
        space.set("c", "x" * 15)  # 26 + 1 + 17 > 40
    space.set("a", "y")  # replacing counts the new size only
    space.set("c", "z")
    with pytest.raises(StoreLimitExceeded, match=r"number of keys .* would be 4 \(limit 3\)"):
        space.set("d", 1)
    assert space.keys() == ["a", "b", "c"] and space.get("a") == "y"
    assert space.usage.keys == 3
    # Limits are per namespace: another tool's namespace starts empty.
    store.namespace(ME.id, "u").set("d", 1)
    store.close()


async def test_an_uncaught_limit_ends_the_call_with_its_code(kv_file: Path) -> None:
    with KeyValueStore.open(kv_file, limits=SMALL) as kv:
        runtime, _ = make_runtime(put, kv=kv)
        result = await runtime.call("put", {"key": "k", "value": "x" * 100})
    assert (
        result.status == "store_limit"
        and result.code == ErrorCode.STORE_LIMIT
        and ErrorCode.STORE_LIMIT.value == -32008
    )
    assert result.for_model() == {
        "status": "store_limit",
        "code": -32008,
        "message": "store 'put': the value's size in bytes for key 'k' would be 102 (limit 20); "
        "nothing was written; keep less under one key (a summary, or split it over several keys)",
    }


async def test_a_caught_limit_lets_the_handler_carry_on() -> None:
    @action(id="careful", description="Keeps what fits.", input=Empty, timeout=5)
    def careful(ctx: ActionContext[Empty]) -> Action:
        try:
            ctx.store.set("notes", "x" * 100)
        except StoreLimitExceeded:
            ctx.store.set("notes", "x")
        return Action.create(ctx.companion_id, "kept", {"notes": ctx.store.get("notes")})

    runtime, recorder = make_runtime(careful, kv=KeyValueStore.in_memory(limits=SMALL))
    assert (await runtime.call("careful", {})).ok
    kept = recorder.sent[0][1]
    assert isinstance(kept, Action) and kept.params.params == {"notes": "x"}


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_value_bytes"):
        StoreLimits(max_value_bytes=0)
