"""A fuller custom action: approval, a client query, progress and a polite refusal."""

from pydantic import BaseModel, Field

from companion.actions import ActionContext, ActionRefused, action
from companion.protocol import Action


class Lamp(BaseModel):
    room: str = Field(description="The room whose lamp to set.")
    level: int = Field(ge=0, le=100, description="Brightness in percent; 0 switches it off.")


@action(
    id="set_lamp",
    description="Set the brightness of the lamp in a room.",
    input=Lamp,
    topic="actions",
    timeout=10,
    requires_approval=True,
    preview=lambda lamp: f"set the {lamp.room} lamp to {lamp.level}%",
)
async def set_lamp(ctx: ActionContext[Lamp]) -> Action:
    reply = await ctx.send_query("lamps", {"room": ctx.input.room}, timeout=5)
    if reply.result is None or not reply.result.success:
        raise ActionRefused(f"there is no lamp in the {ctx.input.room}; ask which room is meant")
    await ctx.progress(50, "lamp found")
    return Action.create(ctx.companion_id, "lamp", {"room": ctx.input.room, "level": ctx.input.level})
