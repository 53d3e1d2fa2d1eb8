"""Which client may answer which query (pure bookkeeping), and the core that feeds it."""

from __future__ import annotations

from companion.bridge.answers import AnswerLedger
from companion.bridge.core import FirehoseCore
from companion.memory import Inbound
from companion.protocol import MESSAGES, QUERIES, Message, Query, QueryResult, QueryResultBody, encode


def test_only_a_client_that_got_the_query_may_answer_and_only_once() -> None:
    ledger = AnswerLedger()
    ledger.delivered("q1", ["a", "b"])
    assert ledger.claim("q1", "c") == "unknown_query"
    assert ledger.claim("nope", "a") == "unknown_query"
    assert ledger.claim("q1", "a") == "ok"
    ledger.confirm("q1")
    assert ledger.claim("q1", "b") == "already_answered"
    assert ledger.claim("q1", "a") == "already_answered"
    ledger.delivered("q1", ["c"])  # a gossip replay of an answered query does not reopen it
    assert ledger.claim("q1", "c") == "already_answered"


def test_a_failed_publish_gives_the_query_back() -> None:
    ledger = AnswerLedger()
    ledger.delivered("q1", ["a", "b"])
    assert ledger.claim("q1", "a") == "ok"
    assert ledger.claim("q1", "b") == "already_answered"  # while a's result is being published
    ledger.release("q1")
    assert ledger.claim("q1", "b") == "ok"


def test_a_result_from_elsewhere_settles_the_query() -> None:
    ledger = AnswerLedger()
    ledger.delivered("q1", ["a"])
    ledger.settled("q1")
    assert ledger.claim("q1", "a") == "already_answered"


def test_the_ledger_is_bounded() -> None:
    ledger = AnswerLedger(max_queries=3)
    for i in range(10):
        ledger.delivered(f"q{i}", ["a"])
    assert len(ledger) == 3
    assert ledger.claim("q0", "a") == "unknown_query"  # forgotten
    assert ledger.claim("q9", "a") == "ok"


def result(query_id: str) -> QueryResult:
    return QueryResult(id=query_id, result=QueryResultBody(success=True, body={"spoken": True}))


def test_the_core_records_deliveries_per_client_topic() -> None:
    core = FirehoseCore()
    a, _ = core.connect()
    messages_only, _ = core.connect({MESSAGES})
    query = Query.create("companion_aya", "speak", {"message": "hi"})
    core.network_payload(Inbound(QUERIES, query, "peer", encode(query)))
    refused = core.claim_answer(messages_only, result(query.id))
    assert refused is not None and refused.code == "unknown_query" and refused.ref == query.id
    assert core.claim_answer(a, result(query.id)) is None
    core.answer_done(query.id, published=True)
    again = core.claim_answer(a, result(query.id))
    assert again is not None and again.code == "already_answered"
    # a query published by this process (a client, through the node's echo) is tracked the same way
    local = Query.create("companion_aya", "approval", {"action": "x"})
    core.network_payload(Inbound(QUERIES, local, "me", encode(local)))
    late, _ = core.connect()
    assert core.claim_answer(late, result(local.id)) is not None  # connected after it was sent
    assert core.claim_answer(a, result(local.id)) is None


def test_results_seen_on_the_network_settle_queries() -> None:
    core = FirehoseCore()
    a, _ = core.connect()
    query = Query.create("companion_aya", "speak", {"message": "hi"})
    core.network_payload(Inbound(QUERIES, query, "peer", encode(query)))
    answered = result(query.id)
    core.network_payload(Inbound(QUERIES, answered, "other-bridge", encode(answered)))
    refused = core.claim_answer(a, result(query.id))
    assert refused is not None and refused.code == "already_answered"
    message = Message.create("companion_aya", ["user_a"], "hello")
    core.network_payload(Inbound(MESSAGES, message, "peer", encode(message)))  # not a query: ignored
