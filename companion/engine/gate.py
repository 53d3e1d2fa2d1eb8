"""The one door everything a companion's engine publishes goes through, closed when it stops.

States, signals, tools' output and tool lists all leave through a :class:`Gate`: once
:meth:`~companion.engine.driver.ConversationEngine.stop` closed it, the node is stopping and
nothing more goes out (a publish then is skipped, logged at debug level, not an error on a
closed node). :class:`Publishes` sends the machine's arrays and signals through it, each under
its deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from companion.log import log_event
from companion.ports import Publisher
from companion.protocol import PREVIEWS, STATES, Envelope, State

__all__ = ["Gate", "Publishes"]

logger = logging.getLogger("companion.engine.driver")


class Gate:
    """A :class:`~companion.ports.Publisher` that passes on until :attr:`closed`.

    :attr:`stopping` comes first: no new turn (a lead due gives rule-based states at once, a slot
    due is given up, no routine speaks), while what is in flight may still go out."""

    def __init__(self, publisher: Publisher, companion: str) -> None:
        self._publisher, self._companion = publisher, companion
        self.stopping = False
        self.closed = False

    async def publish(self, topic: str, envelope: Envelope | list[State]) -> None:
        if self.closed:
            log_event(logger, "not_published", logging.DEBUG, companion=self._companion, topic=topic)
            return
        await self._publisher.publish(topic, envelope)


class Publishes:
    """The machine's states arrays, signals and previews on their way out through the gate, each within
    ``timeout``, counted (:attr:`in_flight`) so that stopping can wait for them. A failure is
    logged, never raised: the turn goes on without it, as if the network had lost it."""

    def __init__(
        self, gate: Publisher, timeout: float, emit: Callable[..., None], ended: Callable[[], None]
    ) -> None:
        self.publisher, self._timeout, self._emit, self._ended = gate, timeout, emit, ended
        self.in_flight = 0

    def start(
        self, nursery: trio.Nursery | None, topic: str, envelope: Envelope | list[State], message_id: str
    ) -> None:
        """Publish in ``nursery`` (``None``: the engine has ended, nothing goes out)."""
        if nursery is not None:
            self.in_flight += 1
            nursery.start_soon(self._publish, topic, envelope, message_id)

    async def _publish(self, topic: str, envelope: Envelope | list[State], message_id: str) -> None:
        try:
            with trio.fail_after(self._timeout):
                await self.publisher.publish(topic, envelope)
        except Exception as exc:  # trio.TooSlowError included
            kinds = {STATES: "states_publish_failed", PREVIEWS: "preview_publish_failed"}
            kind = kinds.get(topic, "signal_publish_failed")
            self._emit(kind, logging.ERROR, message_id=message_id, error=repr(exc))
        finally:
            self.in_flight -= 1
            self._ended()
