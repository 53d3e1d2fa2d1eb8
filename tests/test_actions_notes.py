"""Notes: what a handler tells the model's next step reaches the model-facing result and nothing else."""

from __future__ import annotations

import trio
from pydantic import BaseModel

from companion.actions import (
    MAX_NOTE_CHARS,
    MAX_NOTES,
    ActionContext,
    ActionRefused,
    action,
    knowledge,
)
from companion.memory import MemoryHub
from companion.protocol import MESSAGES, Message, encode
from companion.store.history import InMemoryHistory
from support.actions import OTHER, make_runtime

SECRET = "the user's cat is called Miso"


class Empty(BaseModel):
    pass


@knowledge(id="recall", description="Recall a fact.", input=Empty, output=str, timeout=5)
def recall(ctx: ActionContext[Empty]) -> str:
    ctx.note(SECRET)
    return "found"


@action(id="greet", description="Greet.", input=Empty, topic="messages", timeout=5)
def greet(ctx: ActionContext[Empty]) -> Message:
    ctx.note(SECRET)
    return Message.create(ctx.companion_id, [OTHER.id], "Hello!")


async def test_a_knowledge_tools_note_is_in_the_model_facing_result() -> None:
    runtime, recorder = make_runtime(recall)
    result = await runtime.call("recall", {})
    assert result.ok and result.notes == (SECRET,)
    assert result.for_model() == {"status": "ok", "output": "found", "notes": [SECRET]}
    assert await runtime.call_for_model("recall", {}) == result.for_model()
    assert recorder.sent == []


async def test_an_actions_note_is_never_published_nor_recorded() -> None:
    """Two real endpoints on the in-memory hub: the peer receives the message, never the note."""
    hub = MemoryHub()
    node, peer = hub.endpoint("node"), hub.endpoint("peer")
    history = InMemoryHistory()
    runtime, _ = make_runtime(greet, publisher=node, history=history)
    result = await runtime.call("greet", {})
    assert result.ok and result.for_model()["notes"] == [SECRET]
    [message] = result.published
    with trio.fail_after(5):
        received = await peer.receive_channel.receive()
    assert received.topic == MESSAGES and received.payload == message
    assert SECRET not in encode(message).decode("utf-8")
    assert all(SECRET not in encode(m).decode("utf-8") for m in history.recent(10))
    assert peer.receive_channel.statistics().current_buffer_used == 0


async def test_notes_stay_with_a_failed_call_and_without_them_nothing_changes() -> None:
    @action(id="no", description="Refuses.", input=Empty, timeout=5)
    def no(ctx: ActionContext[Empty]) -> Message:
        ctx.note("tried the kitchen lamp first")
        raise ActionRefused("no lamp there")

    @action(id="plain", description="Says.", input=Empty, topic="messages", timeout=5)
    def plain(ctx: ActionContext[Empty]) -> Message:
        return Message.create(ctx.companion_id, [OTHER.id], "hi")

    runtime, _ = make_runtime(no, plain)
    refused = (await runtime.call("no", {})).for_model()
    assert refused["status"] == "refused" and refused["notes"] == ["tried the kitchen lamp first"]
    assert "notes" not in (await runtime.call("plain", {})).for_model()


async def test_notes_are_bounded_in_count_and_length() -> None:
    @knowledge(id="chatty", description="Notes a lot.", input=Empty, output=str, timeout=5)
    def chatty(ctx: ActionContext[Empty]) -> str:
        ctx.note("x" * (MAX_NOTE_CHARS + 50))
        for i in range(MAX_NOTES * 3):
            ctx.note(f"note {i}")
        return "ok"

    result = await make_runtime(chatty)[0].call("chatty", {})
    assert len(result.notes) == MAX_NOTES
    assert len(result.notes[0]) == MAX_NOTE_CHARS and result.notes[0].endswith("…")
    assert result.notes[-1] == f"note {MAX_NOTES - 2}"


async def test_a_callees_notes_go_to_its_caller_which_decides() -> None:
    @action(id="outer", description="Uses recall.", input=Empty, timeout=5)
    async def outer(ctx: ActionContext[Empty]) -> list[Message]:
        found = await ctx.call("recall")
        assert found.notes == (SECRET,)
        ctx.note("relayed: " + found.notes[0])
        return []

    result = await make_runtime(outer, recall)[0].call("outer", {})
    assert result.notes == ("relayed: " + SECRET,)


async def test_a_leaked_context_cannot_add_notes_later() -> None:
    leaked: list[ActionContext[Empty]] = []

    @knowledge(id="leaks", description="Leaks.", input=Empty, output=str, timeout=5)
    def leaks(ctx: ActionContext[Empty]) -> str:
        leaked.append(ctx)
        return "ok"

    runtime, _ = make_runtime(leaks)
    result = await runtime.call("leaks", {})
    leaked[0].note("too late")
    assert result.notes == ()
