"""The one door everything a companion's engine publishes goes through, closed when it stops.

States, signals, tools' output and tool lists all leave through a :class:`Gate`: once
:meth:`~companion.engine.driver.ConversationEngine.stop` closed it, the node is stopping and
nothing more goes out (a publish then is skipped, logged at debug level, not an error on a
closed node).
"""

from __future__ import annotations

import logging

from companion.log import log_event
from companion.ports import Publisher
from companion.protocol import Envelope, State

__all__ = ["Gate"]

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
