"""The next turn started while the current line is still voiced: a message's preview, held.

A speaker's line is voiced a sentence at a time and its ``message.send`` goes out once it was
heard, so every other node would learn of it, and its leader start deciding, only then: a silent
gap of one states answer between two companions. So the speaker publishes a *preview* of the
exact envelope (same id, same text, same turn extensions) on our own topic
(:data:`~companion.protocol.PREVIEWS`) as soon as the text is complete. A node that receives it
(:class:`~companion.conversation.events.MessagePreviewed`) asks what the message would make it do
if it arrived now -- on a copy of the machine, so the rules are the machine's own and nothing
moves -- and starts only the model work of it: the leader's states call
(:class:`~companion.conversation.events.LeadAhead`) and the likely speaker's prepared reply
(:class:`~companion.conversation.events.Prepare`). Both are held by the driver: nothing is
published or voiced from them, and the conversation does not move.

When the message itself arrives it settles the preview: the same envelope, and the work goes on
as the message's own (the :class:`~companion.conversation.events.Lead` and the ``Prepare`` the
message gives find it and take it when they ask the model the same); a different one, or none
within a speaking slot (``reply_timeout``: no speaker publishes later), and the work is dropped
(:class:`~companion.conversation.events.DropAhead`). So the next speaker's first ``speak`` query
still waits for the states array, which waits for the message: two companions are never voiced
at once.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Final

from companion.conversation.events import (
    DropAhead,
    Effect,
    Event,
    Lead,
    LeadAhead,
    MessagePreviewed,
    MessageSeen,
    Prepare,
)
from companion.conversation.state import MachineState
from companion.protocol import COMPANION_ID_PREFIX, Message

__all__ = ["MAX_HELD", "MAX_SENDERS", "PREVIEW_GAP", "Held", "PreviewBook", "PreviewRules"]

MAX_HELD: Final = 4
"""Previews held at once (one speaker speaks at a time; a few cover a late or a lost message)."""
PREVIEW_GAP: Final = 1.0
"""Seconds a sender's previews are apart at least; those closer are ignored. A speaker previews
one line a turn, and another companion's line comes between two of its turns; a peer that sends
them faster (a flood: each would start paid model work and be dropped) only costs its own
pipelining, since the messages themselves still start their turns as usual."""
MAX_SENDERS: Final = 256
"""Senders whose last preview time is kept (the oldest are forgotten)."""


@dataclass(frozen=True, slots=True)
class Held:
    """A previewed message whose work started, and until when it waits for the message itself."""

    message: Message
    until: float
    lead: bool
    prepare: bool


class PreviewBook:
    """The previews held, oldest first, at most :data:`MAX_HELD` (plain values, no clock)."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, Held] = OrderedDict()

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._held

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, held: Held) -> list[Held]:
        """Hold ``held``; the oldest ones it pushes out (their work must be dropped)."""
        self._held[held.message.params.id] = held
        pushed: list[Held] = []
        while len(self._held) > MAX_HELD:
            pushed.append(self._held.popitem(last=False)[1])
        return pushed

    def pop(self, message_id: str) -> Held | None:
        return self._held.pop(message_id, None)

    def expired(self, now: float) -> list[Held]:
        """The previews whose message did not come by ``now``, no longer held."""
        gone = [h for h in self._held.values() if h.until <= now]
        for held in gone:
            del self._held[held.message.params.id]
        return gone

    def deadline(self) -> float | None:
        return min((h.until for h in self._held.values()), default=None)

    def prepared(self) -> str | None:
        """The newest previewed message this node prepares a reply to, if any."""
        return next((mid for mid, h in reversed(self._held.items()) if h.prepare), None)


class PreviewRules(MachineState):
    """The machine's rules for previews (a mixin of
    :class:`~companion.conversation.machine.Conversation`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.previews = PreviewBook()
        self._preview_times: OrderedDict[str, float] = OrderedDict()
        """When each sender's last preview was taken (at most :data:`MAX_SENDERS`)."""
        self.previews_too_soon = 0
        """Previews ignored for coming within :data:`PREVIEW_GAP` of their sender's last (not
        logged one by one: a flood would flood the log; the next one held says how many)."""

    def receive(self, event: Event, now: float) -> list[Effect]:
        """The machine's own (:meth:`Conversation.receive
        <companion.conversation.machine.Conversation.receive>`); a preview is tried on a copy."""
        raise NotImplementedError

    @property
    def prepared_for(self) -> str | None:
        """A reply prepared for a held preview is kept too (the message is on its way)."""
        ahead = self.previews.prepared()
        return ahead if ahead is not None else super().prepared_for

    def deadline(self) -> float | None:
        times = [t for t in (super().deadline(), self.previews.deadline()) if t is not None]
        return min(times) if times else None

    def _on_preview(self, event: MessagePreviewed, now: float, out: list[Effect]) -> None:
        """Start the model work the message would start if it arrived now, held until it does."""
        message = event.message
        message_id, sender = message.params.id, message.params.from_
        if (
            self.bystander
            or sender == self.me
            or event.publisher != sender
            or not sender.startswith(COMPANION_ID_PREFIX)
            or self.thread.knows(message_id)
            or message_id in self.previews
        ):
            return  # not a companion's own preview, or its message is here already
        last = self._preview_times.get(sender)
        if last is not None and now - last < PREVIEW_GAP:
            self.previews_too_soon += 1
            return  # before the copy of the machine below: a flood costs a dict lookup each
        self._preview_times[sender] = now
        self._preview_times.move_to_end(sender)
        while len(self._preview_times) > MAX_SENDERS:
            self._preview_times.popitem(last=False)
        trial = copy.deepcopy(self)
        trial.previews = PreviewBook()
        effects = trial.receive(MessageSeen(message, event.publisher), now)
        lead = next((e for e in effects if isinstance(e, Lead) and e.message_id == message_id), None)
        prepare = next(
            (e for e in effects if isinstance(e, Prepare) and e.speak.message_id == message_id), None
        )
        if lead is None and prepare is None:
            return
        held = Held(message, now + self.reply_timeout, lead is not None, prepare is not None)
        for pushed in self.previews.hold(held):
            self._drop_ahead(pushed, "too many previews held", out)
        self._log(
            out,
            "preview_held",
            message_id=message_id,
            sender=sender,
            lead=held.lead,
            prepare=held.prepare,
            until=round(self.reply_timeout, 3),
            too_soon=self.previews_too_soon,
        )
        if lead is not None:
            out.append(LeadAhead(lead))
        if prepare is not None:
            out.append(replace(prepare, ahead=True))

    def _settle_preview(self, message: Message, out: list[Effect]) -> None:
        """The message of a held preview arrived: its work goes on if it is the same envelope."""
        held = self.previews.pop(message.params.id)
        if held is None:
            return
        if held.message == message:
            self._log(out, "preview_adopted", message_id=message.params.id, sender=message.params.from_)
            return
        self._drop_ahead(held, "the message differs from its preview", out)

    def _expire_previews(self, now: float, out: list[Effect]) -> None:
        for held in self.previews.expired(now):
            self._drop_ahead(held, f"the message did not arrive within {self.reply_timeout:g} s", out)

    def _drop_ahead(self, held: Held, reason: str, out: list[Effect]) -> None:
        message_id = held.message.params.id
        self._log(out, "preview_dropped", message_id=message_id, reason=reason)
        out.append(DropAhead(message_id, reason))
