"""The speaking slots of a turn: this node's reply and failure, the peers' yields and thinking.

*Speaker*: slot ``k`` of the speaking order opens ``k x reply_timeout`` after the array counted.
A speaker says when it starts preparing (a thinking signal): every node then keeps its slot
open for a reply deadline from that moment, so nodes that accepted the array at different
times still never skip a speaker that is speaking (and an earlier candidate still preparing
withdraws: the later one's node saw its slot pass). A speaker whose model fails gives its slot
up at once and says so with a yield signal; every node then opens the next slot at once.
"""

from __future__ import annotations

from typing import Any

from companion.conversation.events import (
    MAX_DETAIL,
    YIELD_SIGNAL,
    Effect,
    PublishSignal,
    ReplyPublished,
    Speak,
    SpeakingFailed,
    ThinkingSeen,
    YieldSeen,
)
from companion.conversation.rules import reply_recipients
from companion.conversation.state import REPLIED_KEPT, MachineState, latest
from companion.conversation.turn import Phase, Turn

__all__ = ["SlotRules"]


class SlotRules(MachineState):
    """The machine's rules for the speaking slots once an array counted."""

    def _speak_effect(self, turn: Turn) -> Speak:
        assert self.me is not None
        message = turn.message
        recipients = tuple(reply_recipients(message, self.me, self.present))
        people = tuple(self.people)
        fallback = tuple(cid for cid in dict.fromkeys([message.params.from_, *people]) if cid != self.me)
        return Speak(
            turn.message_id,
            message,
            turn.closing,
            turn.replies + 1,
            recipients,
            fallback or recipients,
            people,
        )

    def _on_replied(self, event: ReplyPublished, now: float, out: list[Effect]) -> None:
        turn = self.turn
        if turn is None or turn.message_id != event.message_id or turn.phase is not Phase.SPEAKING:
            return
        self._goto(turn, Phase.REPLIED)
        latest(self._replied, turn.message_id, None, REPLIED_KEPT)
        p = event.reply.params
        self._log(
            out,
            "replied",
            message_id=turn.message_id,
            reply_id=p.id,
            to=list(p.to),
            turn=turn.replies + 1,
            closing=turn.closing,
        )

    def _on_failed(self, event: SpeakingFailed, now: float, out: list[Effect]) -> None:
        turn = self.turn
        if turn is None or turn.message_id != event.message_id or turn.phase is not Phase.SPEAKING:
            return
        assert self.me is not None
        slot = turn.order.index(self.me)
        turn.yielded[self.me] = event.reason
        nxt = next((cid for cid in turn.order[slot + 1 :] if cid not in turn.yielded), None)
        self._log(
            out,
            "speaker_failed",
            "warning",
            message_id=turn.message_id,
            reason=event.reason,
            detail=event.detail[:300],
            next=nxt,
            why=f"could not reply ({event.reason}); gave the slot up to {nxt or 'nobody'} at once",
        )
        params = {"in_reply_to": turn.message_id, "reason": event.reason}
        if event.detail:
            params["detail"] = event.detail[:MAX_DETAIL]  # clients show it (listen, the page, the demo)
        out.append(PublishSignal(YIELD_SIGNAL, params))
        self._goto(turn, Phase.AWAITING_SPEAKER)
        turn.rebase(slot, now, self.reply_timeout)

    def _on_yield(self, event: YieldSeen, now: float, out: list[Effect]) -> None:
        turn = self.turn
        fields = {"message_id": event.in_reply_to, "yielder": event.companion, "publisher": event.publisher}
        if event.publisher != event.companion and not (event.publisher is None and self.bystander):
            self._log(out, "yield_ignored", "info", reason="signed by another companion", **fields)
        elif turn is not None and turn.message_id == event.in_reply_to:
            self._yield(turn, event.companion, event.reason, now, out, fields)
        elif not self.thread.knows(event.in_reply_to):
            # Its message (gossip keeps no order) is still on the way: the yield waits for it.
            held = self._early_yields.pop(event.in_reply_to, {})
            held.setdefault(event.companion, event.reason)
            latest(self._early_yields, event.in_reply_to, held, 64)
            self._log(out, "yield_held", "debug", reason="its message has not arrived", **fields)
        else:
            self._log(out, "yield_ignored", "info", reason="not the current turn", **fields)

    def _yield(
        self, turn: Turn, companion: str, reason: str, now: float, out: list[Effect], fields: dict[str, Any]
    ) -> None:
        """``companion`` gives up its slot of ``turn`` (also before the array is known: it is then
        skipped when its slot comes)."""
        if companion in turn.yielded:
            self._log(out, "yield_ignored", "debug", reason="duplicate", **fields)
            return
        slot: int | None = None
        if turn.states is not None:
            if companion not in turn.order:
                self._log(out, "yield_ignored", "info", reason="not in the speaking order", **fields)
                return
            slot = turn.order.index(companion)
            if turn.slot >= 0 and slot < turn.slot:
                self._log(out, "yield_ignored", "info", reason="its slot has passed", **fields)
                return
        turn.yielded[companion] = reason
        self._log(
            out,
            "speaker_yielded",
            "warning",
            slot=slot,
            reason=reason,
            why=f"{companion} gave its slot up ({reason}); the next in the speaking order goes at once",
            **fields,
        )
        if slot is not None and slot <= max(turn.slot, 0) and not self.bystander:
            turn.rebase(slot, now, self.reply_timeout)

    def _on_thinking(self, event: ThinkingSeen, now: float, out: list[Effect]) -> None:
        """``companion`` is preparing its reply: its slot stays open a reply deadline from now."""
        turn = self.turn
        if (
            self.bystander
            or turn is None
            or turn.message_id != event.in_reply_to
            or turn.states is None
            or event.publisher != event.companion
            or event.companion not in turn.order
            or event.companion == self.me
        ):
            return
        slot = turn.order.index(event.companion)
        current = turn.slot_at(now)
        turn.began = turn.began or event.companion
        if slot < current:
            self._log(out, "thinking_late", "warning", message_id=turn.message_id, speaker=event.companion)
            return
        if slot > current and turn.phase is Phase.SPEAKING:
            # Its node saw this node's slot pass: the later speaker goes on, this one withdraws.
            self._withdraw_speech(turn, event.companion, "a later speaker is already preparing", out)
            turn.yielded[self.me or ""] = "gave_way"
            self._goto(turn, Phase.AWAITING_SPEAKER)
        turn.hold_open(slot, current, now, self.reply_timeout)
        self._log(
            out, "speaker_thinking", "debug", message_id=turn.message_id, speaker=event.companion, slot=slot
        )
