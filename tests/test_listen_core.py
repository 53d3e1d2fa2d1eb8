"""The terminal client's rules, without a terminal or a socket."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from companion.listen.core import END_MARKER, ListenSession, Quit, Send, Show, Speak
from companion.protocol import Action, Message, Query, QueryResult, QueryResultBody, encode
from support.cards import metadata as md

AYA = md("aya", name="Aya")
PIM = md("pim", name="Pim")


def session(**kwargs: Any) -> ListenSession:
    counter = itertools.count(1)
    s = ListenSession("user_yamada", new_id=lambda: f"id-{next(counter)}", **kwargs)
    s.set_companions([AYA, PIM])
    return s


def sent(effects: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(e.frame) for e in effects if isinstance(e, Send)]


def shown(effects: list[Any]) -> list[str]:
    return [e.text for e in effects if isinstance(e, Show)]


def test_user_id_must_start_with_user() -> None:
    with pytest.raises(ValueError, match="user_"):
        ListenSession("yamada")
    with pytest.raises(ValueError):
        ListenSession("user_")


def test_plain_line_goes_to_every_known_companion() -> None:
    s = session()
    frames = sent(s.on_input("hello all"))
    assert frames == [
        {
            "topic": "messages",
            "body": {
                "jsonrpc": "2.0",
                "method": "message.send",
                "params": {
                    "id": "id-1",
                    "from": "user_yamada",
                    "to": ["companion_aya", "companion_pim"],
                    "message": "hello all",
                },
            },
        }
    ]


def test_at_name_addresses_one_or_several() -> None:
    s = session()
    (frame,) = sent(s.on_input("@aya how are you?"))
    assert frame["body"]["params"]["to"] == ["companion_aya"]
    assert frame["body"]["params"]["message"] == "how are you?"
    (frame,) = sent(s.on_input("@Aya @companion_pim both"))
    assert frame["body"]["params"]["to"] == ["companion_aya", "companion_pim"]
    effects = s.on_input("@nobody hi")
    assert sent(effects) == [] and "no companion called 'nobody'" in shown(effects)[0]
    assert "Aya, Pim" in shown(effects)[0]


def test_no_companions_known_yet() -> None:
    s = ListenSession("user_a")
    effects = s.on_input("hello?")
    assert sent(effects) == [] and "no companions known yet" in shown(effects)[0]


def test_companions_seen_speaking_count_as_known() -> None:
    s = ListenSession("user_a")
    s.on_frame(encode(Message.create("companion_kyoko", ["user_a"], "hi")))
    (frame,) = sent(s.on_input("hi kyoko"))
    assert frame["body"]["params"]["to"] == ["companion_kyoko"]


def test_next_nominates_in_metadata_now_or_on_the_next_line() -> None:
    s = session()
    (frame,) = sent(s.on_input("/next pim what do you think?"))
    assert frame["body"]["params"]["metadata"] == {"next_speaker": "companion_pim"}
    assert frame["body"]["params"]["message"] == "what do you think?"
    effects = s.on_input("/next Aya")
    assert sent(effects) == [] and "nominates Aya" in shown(effects)[0]
    (frame,) = sent(s.on_input("@pim tell me"))
    # the nominee is added to the recipients so it takes part in the turn
    assert frame["body"]["params"]["to"] == ["companion_pim", "companion_aya"]
    assert frame["body"]["params"]["metadata"] == {"next_speaker": "companion_aya"}
    (frame,) = sent(s.on_input("and then?"))
    assert "metadata" not in frame["body"]["params"]  # a nomination is used once
    assert "no companion" in shown(s.on_input("/next ghost"))[0]


def test_commands() -> None:
    s = session()
    assert s.on_input("/quit") == [Quit()]
    assert "@NAME" in shown(s.on_input("/help"))[0]
    assert shown(s.on_input("/who")) == ["Aya (companion_aya)", "Pim (companion_pim)"]
    assert "unknown command" in shown(s.on_input("/dance"))[0]
    assert s.on_input("   ") == []


def test_messages_show_who_to_whom_and_emotion() -> None:
    s = session()
    message = Message.create("companion_aya", ["user_yamada", "companion_pim"], "やあ", {"emotion": "happy"})
    assert s.on_frame(encode(message).decode()) == [Show("Aya → you, Pim (happy): やあ", "message")]
    other = Message.create("user_kenji", ["companion_aya"], "yo")
    assert s.on_frame(encode(other)) == [Show("kenji → Aya: yo", "message")]


def test_actions_and_progress_are_shown() -> None:
    s = session()
    wave = Action.create("companion_aya", "wave", {"hand": "left"})
    assert shown(s.on_frame(encode(wave))) == ["* Aya: wave (hand: left)"]
    progress = Action.create(
        "companion_pim", "progress", {"call_id": "c", "action": "search", "percent": 40, "message": "reading"}
    )
    assert shown(s.on_frame(encode(progress))) == ["* Pim: search 40% reading"]


def test_error_frames_and_garbage_are_reported() -> None:
    s = session()
    frame = json.dumps({"error": {"code": "invalid_body", "message": "body is not valid"}})
    assert s.on_frame(frame) == [Show("bridge: body is not valid", "error")]
    assert s.on_frame("{{") == [Show("bridge sent something that is not JSON", "error")]
    assert s.on_frame("[]") == []  # states are not shown


def speak_query(text: str = "hello there") -> Query:
    return Query.create("companion_aya", "speak", {"message": text, "emotion": "happy"}, id="q-1")


def test_speak_query_without_voice_is_shown_and_answered_at_once() -> None:
    s = session()
    effects = s.on_frame(encode(speak_query()))
    assert shown(effects) == ["♪ Aya: hello there"]
    (frame,) = sent(effects)
    assert frame == {
        "topic": "queries",
        "body": {
            "jsonrpc": "2.0",
            "id": "q-1",
            "result": {"success": True, "body": {"spoken": False, "shown": True}},
        },
    }


def test_speak_query_with_voice_is_answered_only_when_done() -> None:
    s = session(voice=True)
    effects = s.on_frame(encode(speak_query()))
    assert [e for e in effects if isinstance(e, Speak)] == [Speak("q-1", "hello there", "happy")]
    assert sent(effects) == []
    (frame,) = sent(s.speak_done("q-1", engine="espeak-ng"))
    assert frame["body"]["result"] == {"success": True, "body": {"spoken": True, "engine": "espeak-ng"}}
    failed = s.speak_done("q-2", error="no audio device")
    (frame,) = sent(failed)
    assert frame["body"]["result"] == {"success": False, "body": {"error": "no audio device"}}
    assert "voice failed" in shown(failed)[0]


def test_speak_queries_can_be_left_to_other_clients() -> None:
    s = session(answer_speak=False)
    assert s.on_frame(encode(speak_query())) == []


def test_speak_query_without_message_gets_an_error_result() -> None:
    s = session()
    query = Query.create("companion_aya", "speak", {"emotion": "happy"}, id="q-3")
    (frame,) = sent(s.on_frame(encode(query)))
    assert frame["body"] == {"jsonrpc": "2.0", "id": "q-3", "error": "speak query without a message"}


def approval_query(query_id: str, preview: str) -> Query:
    body = {
        "call_id": "c1",
        "action": "buy",
        "description": "Buy a thing",
        "side_effects": True,
        "input": {"item": "tea"},
        "preview": preview,
    }
    return Query.create("companion_pim", "approval", body, id=query_id)


def test_approvals_are_answered_oldest_first() -> None:
    s = session()
    effects = s.on_frame(encode(approval_query("a-1", "buy tea")))
    assert shown(effects) == ["? Pim asks to run: buy tea  — approve? [y/n]"]
    s.on_frame(encode(approval_query("a-2", "buy cake")))
    assert s.pending_approvals == 2
    (frame,) = sent(s.on_input("y"))
    assert frame["body"] == {
        "jsonrpc": "2.0",
        "id": "a-1",
        "result": {"success": True, "body": {"approved": True, "reason": "approved by user_yamada"}},
    }
    (frame,) = sent(s.on_input("no"))
    assert frame["body"]["id"] == "a-2" and frame["body"]["result"]["body"]["approved"] is False
    # with nothing pending, "y" is just a message
    (frame,) = sent(s.on_input("y"))
    assert frame["topic"] == "messages"


def test_approval_answered_elsewhere_or_expired_is_dropped() -> None:
    s = session(approval_ttl=100)
    s.on_frame(encode(approval_query("a-1", "buy tea")), now=0)
    other = QueryResult(id="a-1", result=QueryResultBody(success=True, body={"approved": False}))
    assert "answered elsewhere" in shown(s.on_frame(encode(other), now=1))[0]
    assert s.pending_approvals == 0
    s.on_frame(encode(approval_query("a-2", "buy cake")), now=10)
    effects = s.on_input("y", now=111)
    assert "expired" in shown(effects)[0]
    assert sent(effects)[0]["topic"] == "messages"  # the "y" went out as a line, not an answer


def test_the_end_of_a_conversation_is_marked() -> None:
    s = session()
    closing = Message.create("companion_aya", ["user_yamada"], "Good night!", {"closing": "closing"})
    assert shown(s.on_frame(encode(closing))) == ["Aya → you: Good night!"]
    last = Message.create("companion_aya", ["user_yamada"], "Bye!", {"closing": "terminal", "turn": 9})
    assert shown(s.on_frame(encode(last))) == ["Aya → you: Bye!", END_MARKER]


def test_a_result_refused_as_already_answered_is_quiet_unless_it_was_yours() -> None:
    s = session()
    speak_late = json.dumps({"error": {"code": "already_answered", "message": "m", "ref": "q-1"}})
    assert s.on_frame(speak_late) == []  # another client answered the speak query first
    body = {"action": "buy", "preview": "buy tea"}
    s.on_frame(encode(Query.create("companion_pim", "approval", body, id="a-1")), now=0)
    s.on_input("y", now=1)
    approval_late = json.dumps({"error": {"code": "already_answered", "message": "m", "ref": "a-1"}})
    assert shown(s.on_frame(approval_late)) == [
        "(your answer to 'buy tea' came too late: it was already answered elsewhere)"
    ]
    limited = json.dumps({"error": {"code": "rate_limited", "message": "too many frames", "ref": "m-1"}})
    assert s.on_frame(limited) == [Show("bridge: too many frames", "error")]


def test_at_name_says_once_that_it_is_not_private() -> None:
    """``@pim`` only chooses who answers: the line goes out on the public topic (``to`` is a
    field every peer reads), and the person is told so the first time, and in /help."""
    s = session()
    assert "not private" in shown(s.on_input("/help"))[0]
    first = s.on_input("@pim just between us: where is the key?")
    (frame,) = sent(first)
    assert frame["topic"] == "messages" and frame["body"]["params"]["to"] == ["companion_pim"]
    assert any("not private" in line for line in shown(first))
    assert not any("not private" in line for line in shown(s.on_input("@aya and you?")))
    assert not any("not private" in line for line in shown(s.on_input("@ghost hello")))


def test_protocol_is_hidden_and_tool_lists_go_to_who() -> None:
    s = session()
    tools = {"revision": 2, "tools": [{"id": "speak", "description": "Say it", "kind": "action"}]}
    assert s.on_frame(encode(Action.create("companion_aya", "companion.tools", tools))) == []
    assert s.on_frame(encode(Action.create("companion_aya", "companion.future_signal", {"x": 1}))) == []
    assert shown(s.on_input("/who")) == ["Aya (companion_aya): speak", "Pim (companion_pim)"]


def test_stop_closes_the_conversation_for_every_companion_and_is_shown_once() -> None:
    s = session()
    s.seen_companions["companion_kyoko"] = None
    effects = s.on_input("/stop")
    [frame] = [e.frame for e in effects if isinstance(e, Send)]
    body = json.loads(frame)["body"]["params"]
    assert body["to"] == ["companion_aya", "companion_pim", "companion_kyoko"]
    assert body["metadata"] == {"closing": "terminal"}
    assert shown(effects) == ["you stopped the conversation", END_MARKER]
    # another person's stop, from the network; the same message again shows nothing
    other = Message.create(
        "user_ken", ["companion_aya"], "Let's stop here.", {"closing": "terminal"}, id="st-2"
    )
    assert shown(s.on_frame(encode(other))) == ["ken stopped the conversation", END_MARKER]
    assert s.on_frame(encode(other)) == []


def test_history_lines_keep_their_time_and_are_shown_once() -> None:
    s = session()
    first = Message.create("user_ken", ["companion_aya"], "Hi Aya", id="h-1")
    reply = Message.create(
        "companion_aya", ["user_ken", "companion_kyoko"], "Hello!", {"in_reply_to": "h-1"}, id="h-2"
    )
    effects = s.on_history([(100.0, first), (101.5, reply)])
    assert [(e.text, e.at) for e in effects if isinstance(e, Show)] == [
        ("ken → Aya: Hi Aya", 100.0),
        ("Aya → ken, kyoko: Hello!", 101.5),
    ]
    assert s.on_history([(101.5, reply)]) == [] and s.on_frame(encode(reply)) == []
    # the history has no states arrays: a reply stamped "closing" was the last one
    stamp = {"in_reply_to": "h-2", "closing": "closing"}
    to = ["user_ken", "companion_kyoko"]
    last = Message.create("companion_aya", to, "Bye!", stamp, id="h-3")
    assert shown(s.on_history([(102.0, last)])) == ["Aya → ken, kyoko: Bye!", END_MARKER]
    # live, the leader's terminal array says it (not the stamp alone)
    s.on_frame(encode(Message.create("user_ken", ["companion_aya"], "Again?", id="h-4")))
    again = Message.create("companion_aya", to, "Bye!", stamp, id="h-5")
    assert shown(s.on_frame(encode(again))) == ["Aya → ken, kyoko: Bye!"]


def test_a_reply_to_people_alone_ends_the_conversation() -> None:
    s = session()
    only_you = Message.create("companion_aya", ["user_yamada"], "Good night!", {"in_reply_to": "m-1"})
    assert shown(s.on_frame(encode(only_you))) == ["Aya → you: Good night!", END_MARKER]
    # a companion speaking to you first (a routine's greeting) opens a conversation: no marker
    hello = Message.create("companion_aya", ["user_yamada"], "Morning!")
    assert shown(s.on_frame(encode(hello))) == ["Aya → you: Morning!"]
