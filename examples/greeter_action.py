"""Welcome each newcomer by name, and remember them: ``ctx.call``, ``ctx.store``, a routine.

With ``PYTHONPATH=examples`` a card lists it as ``greeter_action:welcome``; the routine in
``examples/greeter.yaml`` runs it when a companion joins.
"""

from pydantic import BaseModel, Field

from companion.actions import ActionContext, action
from companion.protocol import Message


class Newcomer(BaseModel):
    companion: str = Field(description="The id of the companion who arrived.")


@action(id="welcome", description="Welcome a companion who arrived.", input=Newcomer, topic="messages")
async def welcome(ctx: ActionContext[Newcomer]) -> Message:
    who = ctx.input.companion
    visits = ctx.store.get(who, 0) + 1  # this tool's own memory, kept across restarts
    ctx.store.set(who, visits)
    present = await ctx.call("companions")  # another tool, through the same checks
    name = present.output.get(who, {}).get("name", who) if present.ok else who
    ctx.note(f"{name} has now visited {visits} times")  # for the model, never published
    text = f"Welcome, {name}!" if visits == 1 else f"Good to see you again, {name}."
    return Message.create(ctx.companion_id, [who], text)
