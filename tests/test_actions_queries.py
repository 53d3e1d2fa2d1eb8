"""Client queries: published once, answered once, always ended by a deadline."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from companion.actions import QueryTimeout
from companion.actions.queries import PendingQueries
from companion.protocol import QUERIES, Query, QueryResult
from support.actions import ME, answer
from support.recorders import Sink


async def test_query_is_published_and_the_first_answer_wins() -> None:
    recorder = Sink()
    pending = PendingQueries(recorder, ME.id)
    results: list[QueryResult] = []
    async with trio.open_nursery() as nursery:

        async def ask() -> None:
            results.append(await pending.ask("vision", {"look": "left"}, timeout=5, query_id="q1"))

        nursery.start_soon(ask)
        query = await recorder.next_query()
        assert recorder.sent == [(QUERIES, query)]
        assert query.id == "q1" and query.params.from_ == ME.id
        assert query.params.type == "vision" and query.params.body == {"look": "left"}
        assert len(pending) == 1
        assert pending.deliver(answer(query, body={"first": True}))
        assert not pending.deliver(answer(query, body={"second": True}))
    assert results[0].result is not None and results[0].result.body == {"first": True}
    assert len(pending) == 0


async def test_an_error_answer_is_returned_as_is() -> None:
    recorder = Sink()
    pending = PendingQueries(recorder, ME.id)
    results: list[QueryResult] = []
    async with trio.open_nursery() as nursery:

        async def ask() -> None:
            results.append(await pending.ask("vision", None, timeout=5))

        nursery.start_soon(ask)
        query = await recorder.next_query()
        assert query.params.body is None
        pending.deliver(QueryResult(id=query.id, error="camera off"))
    assert results[0].error == "camera off"


async def test_an_answer_arriving_during_publish_is_not_lost() -> None:
    class Echo:
        """A publisher whose client answers before publish even returns."""

        pending: PendingQueries

        async def publish(self, topic: str, envelope: object) -> None:
            assert isinstance(envelope, Query)
            self.pending.deliver(answer(envelope, body={"fast": True}))

    echo = Echo()
    echo.pending = PendingQueries(echo, ME.id)
    result = await echo.pending.ask("vision", None, timeout=1)
    assert result.result is not None and result.result.body == {"fast": True}


async def test_unknown_ids_are_dropped() -> None:
    pending = PendingQueries(Sink(), ME.id)
    assert not pending.deliver(QueryResult(id="nobody-asked", error="x"))


async def test_timeout_raises_and_cleans_up(autojump_clock: trio.testing.MockClock) -> None:
    recorder = Sink()
    pending = PendingQueries(recorder, ME.id)
    start = trio.current_time()
    with pytest.raises(QueryTimeout, match="'speak' query within 3 s") as info:
        await pending.ask("speak", None, timeout=3)
    assert info.value.query_type == "speak" and info.value.timeout == 3
    assert trio.current_time() - start == pytest.approx(3)
    assert len(pending) == 0
    [query] = recorder.queries()
    assert not pending.deliver(answer(query))  # late


async def test_a_publisher_that_hangs_is_bounded_by_the_same_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pending = PendingQueries(Sink(hang=True), ME.id)
    with pytest.raises(QueryTimeout):
        await pending.ask("speak", None, timeout=3)
    assert len(pending) == 0


async def test_a_pending_id_cannot_be_reused() -> None:
    recorder = Sink()
    pending = PendingQueries(recorder, ME.id)
    async with trio.open_nursery() as nursery:

        async def ask() -> None:
            await pending.ask("a", None, timeout=5, query_id="same")

        nursery.start_soon(ask)
        await recorder.next_query()
        with pytest.raises(ValueError, match="already pending"):
            await pending.ask("b", None, timeout=5, query_id="same")
        nursery.cancel_scope.cancel()
    assert len(pending) == 0
