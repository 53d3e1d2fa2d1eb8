"""A custom action; with ``PYTHONPATH=examples`` a card lists it as ``custom_action:wave``."""

from pydantic import BaseModel, Field

from companion.actions import ActionContext, action
from companion.protocol import Action


class Wave(BaseModel):
    times: int = Field(1, ge=1, le=5, description="How many times to wave.")


@action(id="wave", description="Wave a hand at the people you talk to.", input=Wave, timeout=5)
def wave(ctx: ActionContext[Wave]) -> Action:
    return Action.create(ctx.companion_id, "wave", {"times": ctx.input.times})
