"""The bridge's WebRTC front: answers offers and owns the running sessions.

The HTTP route for ``/webrtc/offer`` calls :meth:`RtcGateway.offer` with the request body and
gets back an HTTP status and a JSON body. A successful offer leaves a session running in the
gateway's own nursery, served by the bridge like any other client (``Bridge.serve_channel``).
The gateway is open for a block (``async with RtcGateway(bridge, node) as gateway:``), with its
asyncio island; leaving the block ends every session (each tears itself down within its deadline).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import MappingProxyType

import trio

from companion.log import log_event
from companion.memory import Publisher
from companion.rtc.island import AsyncioIsland, open_island
from companion.rtc.seam import FrameServer
from companion.rtc.session import NegotiationFailed, RtcSession, SessionSettings
from companion.rtc.signaling import OfferError, OfferRequest, answer_body, error_body, parse_offer
from companion.tasks import OwnsTasks
from companion.voice import Synthesizer

__all__ = ["OfferReply", "RtcGateway"]

logger = logging.getLogger("companion.rtc")


@dataclass(frozen=True, slots=True)
class OfferReply:
    """The HTTP answer to a posted offer."""

    status: int
    body: str
    session_id: str | None = None


class RtcGateway(OwnsTasks):
    """Accepts WebRTC clients for one bridge while it is open (``async with``).

    ``server`` serves each client's frames (the bridge); ``publisher`` publishes the speak
    results (the bridge's node: its echo shows them to the bridge's clients too).
    """

    def __init__(
        self,
        server: FrameServer,
        publisher: Publisher,
        *,
        synthesizer: Synthesizer | None = None,
        settings: SessionSettings | None = None,
        max_sessions: int = 32,
    ) -> None:
        self._island: AsyncioIsland | None = None
        self._server = server
        self._publisher = publisher
        self.synthesizer = synthesizer
        self.settings = settings or SessionSettings()
        self.max_sessions = max_sessions
        self._sessions: dict[str, RtcSession] = {}
        self._scopes: dict[str, trio.CancelScope] = {}
        """Each session task's own scope: :meth:`cancel_all` cancels the sessions, not the
        gateway's nursery (offers may still be answered, with a refusal, until the block ends)."""
        self._negotiating = 0
        self._changed = trio.Event()
        self.closed = False

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        """The asyncio island, and the nursery of the sessions inside it (they close first)."""
        async with open_island() as island:
            self._island = island
            try:
                async with super()._lifetime():
                    yield
            finally:
                self._island = None

    def _end(self, nursery: trio.Nursery) -> None:
        """Sessions are asked to close and tear themselves down within their deadlines."""
        self.closed = True
        self.close_all()

    @property
    def island(self) -> AsyncioIsland:
        """The asyncio loop aiortc runs on, while the gateway is open."""
        return self._while_open(self._island)

    @property
    def sessions(self) -> Mapping[str, RtcSession]:
        return MappingProxyType(self._sessions)

    async def offer(self, body: bytes | str, *, query_topics: str | None = None) -> OfferReply:
        """Answer one posted offer (the bridge has already checked token and origin)."""
        request = parse_offer(body, query_topics)
        if isinstance(request, OfferError):
            return _refuse(request)
        if self.closed:
            return _refuse(OfferError(503, "busy", "the bridge is shutting down"))
        if len(self._sessions) + self._negotiating >= self.max_sessions:
            return _refuse(
                OfferError(503, "busy", f"this bridge already has {self.max_sessions} WebRTC clients")
            )
        return await self._accept(request)

    async def _accept(self, request: OfferRequest) -> OfferReply:
        session = RtcSession(self.island, request, synthesizer=self.synthesizer, settings=self.settings)
        self._negotiating += 1
        try:
            sdp = await session.negotiate()
            if self.closed:
                await session.abort()
                return _refuse(OfferError(503, "busy", "the bridge is shutting down"))
        except (NegotiationFailed, trio.TooSlowError) as exc:
            log_event(logger, "rtc_offer_refused", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            return _refuse(OfferError(400, "negotiation_failed", f"cannot answer this offer: {exc}"))
        finally:
            self._negotiating -= 1
        self._sessions[session.id] = session
        self._scopes[session.id] = trio.CancelScope()  # before the task starts: cancel_all sees it
        self._sessions_changed()
        self.tasks.start_soon(self._run, session)
        return OfferReply(200, answer_body(sdp, session.id, session.voice_on), session.id)

    async def _run(self, session: RtcSession) -> None:
        try:
            with self._scopes[session.id]:
                await session.run(self._server, self._publisher)
        except Exception as exc:  # one client's failure must not take the bridge down
            log_event(
                logger,
                "rtc_session_crashed",
                logging.ERROR,
                session=session.id,
                error=f"{type(exc).__name__}: {exc}",
                traceback="".join(traceback.format_exception(exc)),
            )
        finally:
            with trio.CancelScope(shield=True):
                await session.abort()
            self._sessions.pop(session.id, None)
            self._scopes.pop(session.id, None)
            self._sessions_changed()

    async def wait_for_sessions(self, count: int) -> None:
        """Return once exactly ``count`` sessions are live (a session leaves after its teardown);
        the caller sets the deadline."""
        while len(self._sessions) != count:
            await self._changed.wait()

    def _sessions_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @property
    def running(self) -> int:
        """Session tasks still alive (teardown included); none once the gateway is closed."""
        return 0 if self._nursery is None else len(self._nursery.child_tasks)

    def close_all(self, reason: str = "bridge shutting down") -> None:
        """Ask every session to end; each tears itself down within its deadline."""
        for session in list(self._sessions.values()):
            session.close(reason)

    def cancel_all(self) -> None:
        """Cancel every session task at once (they still tear down, shielded, within deadlines).
        The gateway accepts no new sessions afterwards."""
        self.closed = True
        for scope in list(self._scopes.values()):
            scope.cancel()


def _refuse(error: OfferError) -> OfferReply:
    return OfferReply(error.status, error_body(error))
