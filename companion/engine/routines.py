"""The trio shell of :class:`~companion.card.routines.RoutineScheduler`: the real clock, the runtime.

The scheduler decides; this driver tells it what happened (messages, joins and leaves, whether
a conversation is running), sleeps until its deadline (or the end of the conversation's busy
spell, or the next event) in a task of the engine's nursery, and runs each firing through the
action runtime, the path a model's call takes (validation, approval, deadlines).

A routine that speaks never talks over a conversation: the scheduler does not fire it while
one runs, and since a conversation may start while its tool is working, the engine's outgoing
hook asks :meth:`RoutineDriver.admit` about every message a routine's call produces. A message
that would go out while a conversation runs is refused (nothing is published) and the firing
is given back to the scheduler: it fires again, once the conversation is over, within its
``max_wait``. One that goes out makes the conversation busy at once, so two routines firing in
the same instant do not both speak.

The driver also keeps the conversation's busy time, for routines alone: a conversation runs
while a turn is open on this node (the ``in_turn`` it is given says so) or until
``reply_timeout`` after the last message anyone sent (:meth:`RoutineDriver.heard`), unless that
message closed it ``terminal``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

import trio

from companion.actions import ActionRuntime
from companion.card.routines import (
    CompiledRoutine,
    ConversationBusy,
    ConversationIdle,
    Firing,
    RoutineEvent,
    RoutineFinished,
    RoutineScheduler,
)
from companion.card.routines import MessageSeen as RoutineMessage
from companion.conversation.events import MessageSeen
from companion.conversation.rules import stamp_opening, turn_info
from companion.protocol import Message

if TYPE_CHECKING:
    from trio_typing import TaskStatus

__all__ = ["RoutineDriver", "current_firing", "not_a_routine"]

_FIRING: ContextVar[Firing | None] = ContextVar("companion_routine_firing", default=None)
_MIN_SLEEP: Final = 0.01
"""The loop never wakes more often than this, whatever a deadline says."""

Emit = Callable[..., None]


def current_firing() -> Firing | None:
    """The routine firing whose tool call runs in this task (None: a model's or anyone else's)."""
    return _FIRING.get()


def not_a_routine() -> None:
    """Mark the current task as no routine's: a task inherits its spawner's context, and the
    engine's turn work may be started from inside a routine's call (a transport that delivers
    synchronously)."""
    _FIRING.set(None)


class RoutineDriver:
    """Runs one companion's routines while :meth:`run` runs (``nursery.start(driver.run, present)``).

    ``in_turn()``: whether a turn of this node runs (its deadlines, not time alone, end it; the
    engine pokes the driver with :meth:`poke` after every event).
    """

    def __init__(
        self,
        routines: Sequence[CompiledRoutine],
        runtime: ActionRuntime,
        *,
        me: str,
        in_turn: Callable[[], bool],
        reply_timeout: float,
        emit: Emit,
        quiet_start: float,
        rejoin_grace: float,
    ) -> None:
        self._routines = tuple(routines)
        self._runtime = runtime
        self._me = me
        self._in_turn = in_turn
        self._reply_timeout = reply_timeout
        self._last_activity = -math.inf
        self._emit = emit
        self._quiet_start = quiet_start
        self._grace = rejoin_grace
        self._wake = trio.Event()
        self._deferred: set[str] = set()
        self._busy = False
        self.scheduler: RoutineScheduler | None = None

    @property
    def active(self) -> bool:
        return bool(self._routines)

    async def run(
        self, companions: Iterable[str], *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the clock now (quiet for ``quiet_start`` seconds; ``companions``: present now),
        then fire the routines when due, each firing a task of this driver's own, until
        cancelled. A companion without routines has nothing to run."""
        if not self._routines:
            task_status.started()
            return
        now = trio.current_time()
        self.scheduler = RoutineScheduler(
            self._routines,
            me=self._me,
            now=now,
            companions=companions,
            quiet_until=now + self._quiet_start,
            rejoin_grace=self._grace,
        )
        async with trio.open_nursery() as nursery:
            task_status.started()
            await self._loop(nursery)

    def heard(self, seen: MessageSeen) -> None:
        """A message arrived (anyone's, any conversation's): it keeps a conversation running for
        a reply slot, unless it closed it."""
        self._active(seen.info.closing == "terminal")
        self.observe(RoutineMessage(seen.message))

    def _active(self, closed: bool) -> None:
        self._last_activity = -math.inf if closed else trio.current_time()

    def _busy_until(self, now: float) -> float:
        """Until when a conversation runs as far as time alone goes (``now`` or earlier: none;
        ``inf``: until an event says otherwise)."""
        if self._in_turn():
            return math.inf
        return self._last_activity + self._reply_timeout

    def observe(self, event: RoutineEvent) -> None:
        if self.scheduler is not None:
            self.scheduler.observe(event, trio.current_time())
            self._wake.set()

    def poke(self) -> None:
        """Something changed (the conversation moved): look again."""
        self._wake.set()

    def admit(self, firing: Firing, message: Message) -> Message | str:
        """The outgoing hook's verdict on a message a routine's call produced."""
        now = trio.current_time()
        if self._busy_until(now) > now:
            self._deferred.add(firing.routine)
            self._emit("routine_deferred", logging.INFO, routine=firing.routine, tool=firing.tool)
            return "a conversation is running: this routine waits its turn and fires again when it is over"
        opening = stamp_opening(message)  # every node hears a new exchange, whatever came before
        self._active(turn_info(opening).closing == "terminal")  # busy now: no second routine speaks
        return opening

    async def _loop(self, nursery: trio.Nursery) -> None:
        assert self.scheduler is not None
        scheduler = self.scheduler
        while True:
            wake = self._wake = trio.Event()
            now = trio.current_time()
            busy_until = self._busy_until(now)
            busy = busy_until > now
            if busy != self._busy:
                self._busy = busy
                scheduler.observe(ConversationBusy() if busy else ConversationIdle(), now)
            for firing in scheduler.due(now):
                self._emit(
                    "routine_fired", logging.INFO, routine=firing.routine, tool=firing.tool, on=firing.kind
                )
                nursery.start_soon(self._fire, firing)
            at = scheduler.deadline()
            if busy and busy_until < at:
                at = busy_until
            with trio.move_on_at(max(at, now + _MIN_SLEEP) if math.isfinite(at) else math.inf):
                await wake.wait()
            await trio.sleep(0)  # (a wake-up and a deadline at once are one pass)

    async def _fire(self, firing: Firing) -> None:
        assert self.scheduler is not None
        token = _FIRING.set(firing)
        fields: dict[str, Any] = {"routine": firing.routine, "tool": firing.tool}
        try:
            result = await self._runtime.call(firing.tool, dict(firing.input))
        except Exception as exc:  # the runtime settles every call; this is a bug, not a routine's fault
            fields.update(status="crashed", error=repr(exc)[:300])
        else:
            fields.update(status=result.status, code=None if result.code is None else int(result.code))
            if result.message:
                fields["message"] = result.message[:300]
            if result.notes:
                fields["notes_dropped"] = len(result.notes)  # no model step follows a routine
        finally:
            _FIRING.reset(token)
            now = trio.current_time()
            deferred = firing.routine in self._deferred
            fields["deferred"] = deferred
            if deferred:
                self._deferred.discard(firing.routine)
                self.scheduler.give_back(firing, now)
                self.scheduler.observe(ConversationBusy(), now)
                self._busy = True
            else:
                self.scheduler.observe(RoutineFinished(firing.routine), now)
            self._wake.set()
        self._emit("routine_finished", logging.INFO, **fields)
