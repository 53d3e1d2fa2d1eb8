"""Tools the engine's routine tests name in their cards (``support.routines:NAME``)."""

from __future__ import annotations

import trio
from pydantic import BaseModel, Field

from companion.actions import ActionContext, action, knowledge
from companion.protocol import Action, Message


class Empty(BaseModel):
    pass


class Target(BaseModel):
    to: str = Field(description="Whom to address.")


@action(id="ping", description="Tell clients the companion is alive.", input=Empty, timeout=5)
def ping(ctx: ActionContext[Empty]) -> Action:
    count = ctx.store.get("count", 0) + 1
    ctx.store.set("count", count)
    return Action.create(ctx.companion_id, "ping", {"count": count})


@action(
    id="slow_hello",
    description="Think for 3 s, then greet someone.",
    input=Target,
    topic="messages",
    timeout=10,
)
async def slow_hello(ctx: ActionContext[Target]) -> Message:
    await trio.sleep(3)
    return Message.create(ctx.companion_id, [ctx.input.to], "Hello from a routine!")


SECRET = "the user's cat is called Miso"


@knowledge(id="recall", description="Recall what you know.", input=Empty, output=str, timeout=5)
def recall(ctx: ActionContext[Empty]) -> str:
    ctx.note(SECRET)
    return "nothing new"


@action(id="jam", description="Always jams.", input=Empty, timeout=5)
def jam(ctx: ActionContext[Empty]) -> Action:
    raise RuntimeError("the door is jammed")


@action(id="guarded", description="Asks first.", input=Empty, timeout=5, requires_approval=True)
def guarded(ctx: ActionContext[Empty]) -> Action:
    return Action.create(ctx.companion_id, "opened", {})


class Utterance(BaseModel):
    text: str = Field(min_length=1, description="What to say.")
    to: list[str] = Field(description="Ids of the recipients.")


@action(id="announce", description="Say something; the line is `text`.", input=Utterance, topic="messages")
def announce(ctx: ActionContext[Utterance]) -> Message:
    """A card's own speaking action whose line is not ``message``."""
    return Message.create(ctx.companion_id, ctx.input.to, ctx.input.text)
