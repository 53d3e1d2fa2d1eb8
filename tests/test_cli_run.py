"""`companion run`'s engine wiring: which model each card gets, one check per distinct model,
the handler the default factory builds, start-up refusals (exit 2 before any node starts), and
the lines it prints for scripts."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from companion.app import clients as client_wiring
from companion.app.bridge import BridgeOptions, make_bridge
from companion.app.engines import (
    CompanionHandler,
    EngineOptions,
    PendingHandler,
    engine_handlers,
    model_spec,
    prepare_models,
)
from companion.app.lines import announce_directory, parse_sees, sees_line
from companion.card.model import LoadedCard, load_card
from companion.cli import main
from companion.engine.driver import EngineTimings
from companion.memory import Inbound
from companion.models.scripted import ScriptedModel
from companion.node import CompanionNode, NodeConfig
from companion.protocol import MESSAGES, Message
from companion.store.sqlite import Store
from support.cards import write_card
from support.fake_llm_server import running_server
from support.recorders import Recorder


def loaded(tmp_path: Path, *specs: tuple[str, str | None]) -> list[LoadedCard]:
    return [load_card(write_card(tmp_path, key, model=model)) for key, model in specs]


def test_the_model_is_the_override_else_the_cards_else_scripted(tmp_path: Path) -> None:
    own, plain = loaded(tmp_path, ("own", "openai:m"), ("plain", None))
    assert model_spec(own, None) == "openai:m"
    assert model_spec(plain, None) == "scripted"
    assert model_spec(own, "anthropic:x") == model_spec(plain, "anthropic:x") == "anthropic:x"


async def test_each_card_gets_its_own_scripted_seed_and_the_card_setting_is_honoured(tmp_path: Path) -> None:
    cards = loaded(tmp_path, ("a", "scripted:7"), ("b", None), ("c", None))
    models = await prepare_models(cards, EngineOptions(seed=3, pace=0.5))
    a, b, c = (models[f"companion_{k}"] for k in "abc")
    assert (a.spec, b.spec, c.spec) == ("scripted:7", "scripted", "scripted")
    assert [m.model.seed for m in (a, b, c) if isinstance(m.model, ScriptedModel)] == [7, 4, 5]
    assert a.timings == b.timings == EngineTimings.offline(0.5)

    overridden = await prepare_models(cards, EngineOptions(model="scripted", seed=3))
    seeds = [m.model.seed for m in overridden.values() if isinstance(m.model, ScriptedModel)]
    assert seeds == [3, 4, 5]


async def test_a_provider_model_is_built_and_checked_once_for_the_cards_sharing_it(tmp_path: Path) -> None:
    cards = loaded(tmp_path, ("a", "openai:fake-1"), ("b", "openai:fake-1"), ("c", None))
    with running_server() as server:
        models = await prepare_models(cards, EngineOptions(base_url=server.openai_base_url, pace=1.0))
        listings = [r for r in server.requests if r.path == "/v1/models"]
    a, b, c = (models[f"companion_{k}"] for k in "abc")
    assert a.model is b.model and len(listings) == 1
    assert a.timings == EngineTimings(pace=1.0)
    assert isinstance(c.model, ScriptedModel) and c.timings == EngineTimings.offline(1.0)


async def test_the_default_factory_builds_an_engine_for_the_card_with_its_model(tmp_path: Path) -> None:
    cards = loaded(tmp_path, ("a", "scripted:9"), ("b", None))
    models = await prepare_models(cards, EngineOptions(seed=1))
    factory = engine_handlers(models, data_dir=tmp_path / "data")
    async with trio.open_nursery() as nursery:
        for one in cards:
            cid = one.card.metadata.id
            node = CompanionNode(one.card.metadata, NodeConfig(name=cid))
            handler = await factory(one, node, nursery)
            assert isinstance(handler, CompanionHandler)
            engine = handler.engine
            assert engine.loaded is one and engine.me.id == cid
            assert engine.model is models[cid].model and engine.timings == models[cid].timings
            assert isinstance(engine.history, Store)  # history and memory on disk, per companion
            assert (tmp_path / "data" / cid).is_dir()
        nursery.cancel_scope.cancel()
    seeds = {m.model.seed for m in models.values() if isinstance(m.model, ScriptedModel)}
    assert seeds == {9, 2}


def _said(recorder: Recorder) -> list[str]:
    """The texts of what ``recorder`` was handed, each of them a message."""
    assert all(isinstance(item.payload, Message) for item in recorder.items)
    return [item.payload.params.message for item in recorder.items if isinstance(item.payload, Message)]


async def test_a_pending_handler_holds_payloads_in_order_until_the_engine_is_given() -> None:
    """A node runs with it while its engine is prepared: what arrives waits, nothing is lost."""
    pending, engine = PendingHandler(), Recorder()
    received: list[str] = []
    send, recv = trio.open_memory_channel[Inbound](8)

    async def dispatch() -> None:  # as the node's dispatcher: one payload at a time, in order
        async for item in recv:
            received.append(item.payload.params.message)  # type: ignore[union-attr]
            await pending.handle(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dispatch)
        for n in range(3):
            message = Message.create("user_a", ["companion_a"], f"m{n}")
            send.send_nowait(Inbound(MESSAGES, message, "peer", b""))
        await trio.testing.wait_all_tasks_blocked()
        assert received == ["m0"] and _said(engine) == [] and pending.handler is None
        pending.become(engine)
        await trio.testing.wait_all_tasks_blocked()
        assert _said(engine) == ["m0", "m1", "m2"] and pending.handler is engine
        with pytest.raises(RuntimeError, match="already given"):
            pending.become(Recorder())
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("where", ["flag", "card"])
def test_an_unusable_model_stops_run_with_exit_2_before_its_companion_is_announced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """The node dials while the model is checked (start-up), so its key exists by then; the
    failure names where the spec came from (the flag, or the card's file and field), stops the
    node and no ``peer`` line ever says the companion is up."""
    args = ["--model", "openai:x"] if where == "flag" else []
    path = write_card(tmp_path, "a", model="openai:x" if where == "card" else None)
    data = tmp_path / "data"
    argv = [
        "run",
        str(path),
        *args,
        "--no-mdns",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--data-dir",
        str(data),
    ]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2
    said = err.strip().splitlines()[-1]
    if where == "flag":  # the check's own line said it, once
        assert said.startswith("companion: openai:x: failed after ") and "127.0.0.1:9" in said
        assert err.count("127.0.0.1:9/v1;") == 1, err
    else:  # where the spec came from is named
        assert said.startswith(f"companion run: {path}: settings.model: openai:x: ") and "127.0.0.1:9" in said
    assert " peer " not in out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--token", "t"], "need --ws"),
        (["--no-webrtc"], "need --ws"),
        (["--ws", "nowhere"], "--ws 'nowhere'"),
        (["--pace", "-1"], "--pace"),
        (["--model", "nonsense"], "model spec 'nonsense'"),
    ],
)
def test_bad_options_are_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    path = write_card(tmp_path, "a")
    assert main(["run", str(path), "--no-mdns", "--data-dir", str(tmp_path / "data"), *args]) == 2
    assert said in capsys.readouterr().err


def test_sees_lines_round_trip_and_other_lines_are_not_taken_for_them() -> None:
    line = sees_line("companion_a", ["companion_b", "companion_a"])
    assert line == "companion_a sees companion_a,companion_b"
    assert parse_sees(line) == ("companion_a", frozenset({"companion_a", "companion_b"}))
    for other in (
        "companion_a peer 12D3KooW",
        "  /ip4/127.0.0.1/tcp/1",
        "bridge ws://127.0.0.1:1/",
        "x sees y",
    ):
        assert parse_sees(other) is None


async def test_clients_are_let_in_when_the_clients_node_does_not_meet_the_companions_in_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """The wait for the clients' node to meet this process's companions has a deadline: after it,
    a warning, and clients may connect anyway (here the node never runs, so it meets nobody)."""
    monkeypatch.setattr(client_wiring, "CLIENT_NODE_TIMEOUT", 0.2)
    caplog.set_level(logging.WARNING, logger="companion.app.clients")
    node = CompanionNode(None, NodeConfig(name="clients"))
    options = BridgeOptions(host="127.0.0.1", port=0, webrtc=False)
    clients = client_wiring.ClientNode(node, make_bridge(options, node), "/ip4/127.0.0.1/tcp/1")
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            port = await nursery.start(client_wiring.let_clients_in, options, clients, {"companion_a"})
        stream = await trio.open_tcp_stream("127.0.0.1", port)  # the bridge listens
        await stream.aclose()
        nursery.cancel_scope.cancel()
    [warning] = [
        r for r in caplog.records if getattr(r, "companion_event", "") == "clients_node_not_connected"
    ]
    assert getattr(warning, "companion_fields", {})["missing"] == ["companion_a"]
    assert f"bridge ws://127.0.0.1:{port}/" in capsys.readouterr().out.splitlines()


class _ClosedStdout:
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_does_not_stop_a_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The sees lines are printed from inside the node (membership listeners): a reader that went
    away (``companion run ... | head``) costs a warning, not the node."""
    [one] = loaded(tmp_path, ("a", None))
    node = CompanionNode(one.card.metadata, NodeConfig(name="companion_a"))
    monkeypatch.setattr("sys.stdout", _ClosedStdout())
    caplog.set_level(logging.WARNING, logger="companion.app.lines")
    announce_directory(node)
    assert [getattr(r, "companion_event", "") for r in caplog.records] == ["stdout_closed"]
