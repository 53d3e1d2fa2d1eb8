"""How the driver carries out each effect the machine returns: one method per effect type, and
:data:`EFFECTS`, the table that names them.

The counterpart of the machine's :data:`~companion.conversation.machine.HANDLERS`: the machine
looks up (phase, event type) to take an event, the driver looks up the effect's type to carry
it out (:meth:`~companion.engine.driver.ConversationEngine._do`). The table is checked when it
is built (:func:`~companion.conversation.events.effect_table`), so an effect type added to the
machine's vocabulary without its method here fails at the driver's import, never silently at
run time. The methods are the driver's (:class:`EffectMethods` is a base of
:class:`~companion.engine.driver.ConversationEngine`); :class:`_Driver` says what of the driver
they use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import trio

from companion.conversation import events as ev
from companion.conversation.machine import Conversation
from companion.engine.gate import Gate, Publishes
from companion.engine.speech import Speech
from companion.engine.work import Job, TurnWork, Work
from companion.protocol import ACTIONS, STATES, Action, Metadata

__all__ = ["EFFECTS", "EffectMethods"]


class _Driver(Protocol):
    """What the effect methods use of the driver."""

    me: Metadata
    conversation: Conversation
    _gate: Gate
    _work: TurnWork
    _tasks: dict[tuple[str, str], Work]
    _publishes: Publishes

    def _feed(self, event: ev.Event) -> None: ...

    def _emit(self, kind: str, level: int = logging.INFO, **fields: Any) -> None: ...

    def _taking_work(self) -> trio.Nursery | None: ...

    def _start(self, what: str, message_id: str, job: Job, speech: Speech | None = None) -> None: ...


class EffectMethods:
    """The driver's method for each effect type (named by :data:`EFFECTS`)."""

    def _decision(self: _Driver, effect: ev.Decision) -> None:
        self._emit(effect.event, logging.getLevelNamesMapping()[effect.level.upper()], **effect.fields)

    def _lead(self: _Driver, effect: ev.Lead) -> None:
        if self._gate.stopping:  # no model call now: the rule-based states, so the turn goes on
            self._feed(ev.StatesReady(effect.message_id, None, "fallback_stopping"))
        else:
            self._start("lead", effect.message_id, self._work.lead(effect))

    def _publish_states(self: _Driver, effect: ev.PublishStates) -> None:
        self._publishes.start(self._taking_work(), STATES, effect.states, effect.message_id)

    def _publish_signal(self: _Driver, effect: ev.PublishSignal) -> None:
        action = Action.create(self.me.id, effect.name, dict(effect.params))
        self._publishes.start(self._taking_work(), ACTIONS, action, effect.params.get("in_reply_to", ""))

    def _speak(self: _Driver, effect: ev.Speak) -> None:
        if self._gate.stopping:
            self._feed(ev.SpeakingFailed(effect.message_id, "stopping"))
        else:
            speech = Speech(effect, self.conversation.replied)
            self._start("speech", effect.message_id, self._work.reply(speech), speech)

    def _prepare(self: _Driver, effect: ev.Prepare) -> None:
        nursery = self._taking_work()
        if nursery is not None and not self._gate.stopping:
            self._work.prepare(effect.speak, nursery, ahead=effect.ahead)

    def _lead_ahead(self: _Driver, effect: ev.LeadAhead) -> None:
        nursery = self._taking_work()
        if nursery is not None and not self._gate.stopping:
            self._work.lead_ahead(effect.lead, nursery)

    def _drop_ahead(self: _Driver, effect: ev.DropAhead) -> None:
        self._work.drop_ahead(effect.message_id, effect.reason)

    def _withdraw(self: _Driver, effect: ev.Withdraw) -> None:
        held = self._tasks.pop((effect.what, effect.message_id), None)
        if held is not None:
            held.scope.cancel()


EFFECTS: Final[Mapping[type[Any], Callable[[_Driver, Any], None]]] = ev.effect_table(
    {
        ev.Decision: EffectMethods._decision,
        ev.Lead: EffectMethods._lead,
        ev.PublishStates: EffectMethods._publish_states,
        ev.PublishSignal: EffectMethods._publish_signal,
        ev.Speak: EffectMethods._speak,
        ev.Prepare: EffectMethods._prepare,
        ev.LeadAhead: EffectMethods._lead_ahead,
        ev.DropAhead: EffectMethods._drop_ahead,
        ev.Withdraw: EffectMethods._withdraw,
    },
)
"""How the driver carries out each effect the machine returns. An effect type without its
method fails here, at import."""
