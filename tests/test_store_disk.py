"""A disk that fills up under a running companion: its stores log, count and retry, never raise.

The condition is real: a child process, in a mount namespace of its own, puts its data directory
on a tmpfs of 4 MiB that a filler file has nearly filled, so SQLite's writes fail with ENOSPC
(``database or disk is full``) while a trio loop records messages at 500 a second. Freeing the
space must bring the writers back without losing anything they had queued. A data directory on
a read-only mount refuses to open with a message naming the file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_CHILD = textwrap.dedent(
    """
    import json, logging, os, subprocess, sys, time
    import trio
    from companion.actions import KeyValueStore
    from companion.protocol import Message
    from companion.store.sqlite import DB_FILENAME, Store, StoreError

    root = sys.argv[1]
    events = []

    class Count(logging.Handler):
        def emit(self, record):
            events.append(record.getMessage())

    logging.getLogger("companion").addHandler(Count())
    logging.getLogger("companion").setLevel(logging.DEBUG)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "none", root], check=True)
    store = Store.in_directory(os.path.join(root, "a"))
    kv = KeyValueStore.open(os.path.join(root, "a", "tools.sqlite3"))
    filler = os.path.join(root, "filler")

    def fill(leave):
        with open(filler, "ab", buffering=0) as out:
            try:
                while True:
                    out.write(b"x" * 1024)
            except OSError:
                pass
        os.truncate(filler, os.path.getsize(filler) - leave)

    fill(32 * 1024)  # the disk is full but for a few pages
    out = {}

    async def main():
        recorded = 0
        for i in range(1500):  # 3 s at 500 messages a second
            msg = Message.create("companion_b", ["companion_a"], f"message {i} " + "z" * 200, id=f"m{i}")
            recorded += store.record(msg)
            await trio.sleep(0.002)
        out["recorded"] = recorded
        out["while_full"] = store.stats()
        fill(0)
        kv.namespace("companion_a", "notes").set("full", {"at": recorded, "pad": "p" * 8000})
        out["kv_durable_while_full"] = await kv.flush(timeout=1.0)
        out["view"] = [m.params.id for m in store.recent(3)]
        os.remove(filler)
        out["flushed"] = await trio.to_thread.run_sync(store.sync, 20.0)
        out["kv_durable"] = await kv.flush(timeout=20.0)
        out["after"] = store.stats()

    trio.run(main)
    store.close()
    kv.close()
    with Store.in_directory(os.path.join(root, "a")) as again:
        out["reopened"] = len(again)
    with KeyValueStore.open(os.path.join(root, "a", "tools.sqlite3")) as again:
        out["kv_value"] = again.namespace("companion_a", "notes").get("full")
    out["events"] = {e: events.count(e) for e in set(events) if e.startswith("sql_write")}
    ro = os.path.join(root, "ro")
    os.makedirs(os.path.join(ro, "b"))
    subprocess.run(["mount", "--bind", ro, ro], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", ro], check=True)
    try:
        Store.in_directory(os.path.join(ro, "b"))
    except StoreError as exc:
        out["read_only"] = str(exc)
    print(json.dumps(out), flush=True)
    """
)


def _unshare() -> str:
    tool = shutil.which("unshare")
    if tool is None:
        pytest.skip("no unshare(1) here to make a mount namespace")
    probe = subprocess.run([tool, "-m", "true"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip(f"mount namespaces are not permitted here: {probe.stderr.decode()[:200]}")
    return tool


def test_a_full_disk_is_logged_counted_and_survived(tmp_path: Path) -> None:
    tool = _unshare()
    root = tmp_path / "disk"
    root.mkdir()
    done = subprocess.run(
        [tool, "-m", sys.executable, "-c", _CHILD, str(root)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["recorded"] == 1500  # every record() answered, none raised
    assert out["view"] == ["m1497", "m1498", "m1499"]  # the node reads on from its view
    assert out["while_full"]["failures"] >= 1 and out["while_full"]["backlog"] > 0
    assert out["kv_durable_while_full"] is False  # the tool's write is not on disk: said so
    assert out["flushed"] is True and out["kv_durable"] is True  # space again: all of it written
    assert out["after"]["lost"] == 0 and out["after"]["backlog"] == 0
    assert out["reopened"] == 1500 and out["kv_value"]["at"] == 1500
    # One line when the failures start and one when they end, per writer: bounded, not per write.
    assert out["events"] == {"sql_write_failed": 2, "sql_write_recovered": 2}
    assert "cannot open the store at" in out["read_only"] and "ro/b/companion.sqlite3" in out["read_only"]
