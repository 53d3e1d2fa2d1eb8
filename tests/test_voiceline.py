"""The speaker's live line: sentences voiced in order as the model writes them, one check point
before each, and what was said as the message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import trio
import trio.testing

from companion.actions.builtins import DEAF_WAIT, VOICE_TOOL, sentence_wait
from companion.actions.results import QueryTimeout
from companion.engine.speech import _sentence_check
from companion.engine.voiceline import LiveVoiceLine
from companion.lines.check import NOT_SAID, LineContext, begins_an_earlier_sentence
from companion.lines.sentences import join_sentences
from companion.protocol import Message, QueryResult, QueryResultBody


class Client:
    """A client on the other side of the queries: says each sentence in ``speaking`` seconds
    (``None``: never answers), and records what it was asked and when."""

    def __init__(self, speaking: float | None = 1.0, interrupt_at: int | None = None) -> None:
        self.speaking = speaking
        self.interrupt_at = interrupt_at
        """The sentence (``part``) the person cuts short, as the WebRTC voice answers a stop."""
        self.asked: list[tuple[float, str, dict[str, Any]]] = []

    async def ask(
        self, kind: str, body: Mapping[str, Any] | None, timeout: float, metadata: Mapping[str, Any] | None
    ) -> QueryResult:
        assert kind == "speak" and body is not None and metadata is not None
        self.asked.append((trio.current_time(), str(body["message"]), dict(metadata)))
        if self.speaking is None or self.speaking > timeout:
            await trio.sleep(timeout)
            raise QueryTimeout(kind, timeout)
        await trio.sleep(self.speaking)
        if metadata["part"] == self.interrupt_at:
            cut = {"interrupted": True, "reason": "stop"}
            return QueryResult(id="q", result=QueryResultBody(success=False, body=cut))
        return QueryResult(id="q", result=QueryResultBody(success=True, body={"spoken": True}))


def emit(*_args: Any, **_fields: Any) -> None:
    pass


async def finished(client: Client, text: str, wait: float = 30) -> str:
    """A line run beside its voicing loop, finished with ``text`` at once: what was said."""
    line = LiveVoiceLine(client.ask, emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        return await line.finish(text, "neutral", wait)


async def test_sentences_go_out_in_order_while_the_line_is_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = Client(speaking=1.0)
    line = LiveVoiceLine(client.ask, emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "The sea is calm")
        await trio.testing.wait_all_tasks_blocked()
        assert client.asked == []  # no half sentence
        line.grow(VOICE_TOOL, "The sea is calm. Three boats came")
        await trio.testing.wait_all_tasks_blocked()
        assert [a[1] for a in client.asked] == ["The sea is calm."]
        said = await line.finish("The sea is calm. Three boats came in. Shall we go?", "happy", 30)
    assert said == "The sea is calm. Three boats came in. Shall we go?"
    assert [a[1] for a in client.asked] == ["The sea is calm.", "Three boats came in.", "Shall we go?"]
    metas = [a[2] for a in client.asked]
    assert [m["part"] for m in metas] == [0, 1, 2] and {m["line"] for m in metas} == {line.id}
    assert [m["last"] for m in metas] == [False, False, True]
    times = [a[0] for a in client.asked]
    assert times[1] - times[0] >= 1.0 and times[2] - times[1] >= 1.0  # each waited for in turn


async def test_a_refused_sentence_ends_what_is_voiced(autojump_clock: trio.testing.MockClock) -> None:
    client = Client()
    checked: list[tuple[str, tuple[str, ...]]] = []

    def check(sentence: str, before: tuple[str, ...]) -> str | None:
        checked.append((sentence, before))
        return "a copy of an earlier line" if sentence.startswith("Hello") else None

    line = LiveVoiceLine(client.ask, emit, check=check)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        said = await line.finish("Fine. Hello again. And more.", "neutral", 30)
    assert said == "Fine."
    assert [a[1] for a in client.asked] == ["Fine."]
    assert checked == [("Fine.", ()), ("Hello again.", ("Fine.",))]


async def test_a_line_nobody_heard_starts_over_with_the_next(autojump_clock: trio.testing.MockClock) -> None:
    """The model's first try began a numbered list ("1." refused: nothing heard); its next try,
    or the card's own line, is voiced from its start. A line once heard never starts over."""

    def check(sentence: str, before: tuple[str, ...]) -> str | None:
        return "no words" if sentence == "1." else None

    client = Client()
    line = LiveVoiceLine(client.ask, emit, check=check)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "1. User_bench -> Juniper: Hello")
        line.grow(VOICE_TOOL, "1. User_bench -> Juniper: Hello. 2. Juniper:")  # the same try: still refused
        await trio.testing.wait_all_tasks_blocked()
        assert client.asked == []
        said = await line.finish("The harbour was full of boats. Shall we go?", "happy", 30)
    assert said == "The harbour was full of boats. Shall we go?"
    assert [a[1] for a in client.asked] == ["The harbour was full of boats.", "Shall we go?"]

    heard = Client()
    line = LiveVoiceLine(heard.ask, emit, check=lambda s, _b: "a copy" if s.startswith("Hello") else None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "Fine. Hello again. ")
        await trio.testing.wait_all_tasks_blocked()
        said = await line.finish("Something else entirely.", "neutral", 30)
    assert said == "Fine." and [a[1] for a in heard.asked] == ["Fine."]


async def test_a_line_finished_with_nothing_heard_voices_no_later_line(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its next line (the model's second try, the card's own) goes out on its own: the handler
    voices it when the live line no longer does."""
    client = Client()
    line = LiveVoiceLine(client.ask, emit, check=lambda s, _b: "a copy" if s.startswith("Hey") else None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        assert line.voices(VOICE_TOOL)
        assert await line.finish("Hey, I'm Juniper. I saw boats.", "neutral", 30) == ""
    assert client.asked == [] and not line.voices(VOICE_TOOL)
    heard = LiveVoiceLine(client.ask, emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(heard.run)
        assert await heard.finish("The sea is calm.", "neutral", 30) == "The sea is calm."
    assert heard.voices(VOICE_TOOL)  # a line once heard stays this reply's line


async def test_a_cut_line_says_only_its_complete_sentences(autojump_clock: trio.testing.MockClock) -> None:
    client = Client()
    line = LiveVoiceLine(client.ask, emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "One. Two. Thr")
        line.end()
    assert line.said == "One. Two."
    assert [a[1] for a in client.asked] == ["One.", "Two."]
    assert client.asked[-1][2]["last"] is True


async def test_a_client_that_never_answers_holds_the_line_one_sentence_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = Client(speaking=None)
    start = trio.current_time()
    said = await finished(client, "One. Two. Three.", 100)
    assert said == "One. Two. Three."
    assert trio.current_time() - start == sentence_wait("One.") + 2 * DEAF_WAIT


async def test_the_line_waits_no_longer_than_it_is_given(autojump_clock: trio.testing.MockClock) -> None:
    client = Client(speaking=50.0)
    line = LiveVoiceLine(client.ask, emit)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        said = await line.finish("One. Two.", "neutral", 3.0)
        assert trio.current_time() - start == 3.0
        nursery.cancel_scope.cancel()
    assert said == "One. Two."


async def test_other_tools_are_not_voiced(autojump_clock: trio.testing.MockClock) -> None:
    line = LiveVoiceLine(Client().ask, emit)
    line.grow("speak", "One. Two")
    assert not line.started and not line.voices("speak") and line.voices(VOICE_TOOL)


def test_sentences_join_back_into_a_line() -> None:
    assert join_sentences(["One.", "Two."]) == "One. Two."
    assert join_sentences(["はい。", "そうです。", "OK."]) == "はい。そうです。OK."


async def test_an_interrupted_sentence_ends_the_line_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = Client(interrupt_at=1)
    said = await finished(client, "One. Two. Three.")
    assert said == "One."  # the cut sentence is not published as said
    assert [a[1] for a in client.asked] == ["One.", "Two."]  # nothing more is voiced


async def test_an_interrupted_line_settles_as_heard_while_the_model_still_writes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The person cut the second piece short: the model may stop writing (barge-in), and the
    line is what was heard, a lone first clause included (no line follows an interruption)."""
    client = Client(speaking=0.5, interrupt_at=1)
    line = LiveVoiceLine(client.ask, emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "I am not sure how this can be done, but I think the tide will turn. And then")
        await trio.sleep(5)
        assert line.settled == "I am not sure how this can be done," and not line.abandoned
        line.end()


async def test_a_speaker_s_sentences_pass_the_line_check_before_they_are_heard(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The speaker's own check (``companion.lines.check`` per sentence): the prompt read aloud, or a
    sentence copied from the conversation, is never voiced, nor anything after it."""
    said_before = [
        Message.create("companion_pim", ["companion_juniper"], "I baked bread with rye and seeds today.")
    ]
    context = LineContext.of(said_before, "companion_juniper", {"companion_pim": "Pim"}, ["Speak warmly."])
    client = Client()
    line = LiveVoiceLine(client.ask, emit, check=_sentence_check(context))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        said = await line.finish('The fog lifted at noon. Context: {"memory": {}}. Then more.', "neutral", 30)
    assert said == "The fog lifted at noon."
    assert [a[1] for a in client.asked] == ["The fog lifted at noon."]


async def test_a_line_that_loops_is_heard_up_to_where_it_says_something_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """SmolLM2-135M behind llama.cpp's server (no repetition penalty by default) wrote lines that
    say one sentence again and again to the token limit. The line is what it said before the
    first sentence it repeats; nothing after that is voiced."""
    context = LineContext.of([], "companion_juniper", {"companion_pim": "Pim"}, ["Speak warmly."])
    client, line = checked(context)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        looped = "A street, I see. A street in a place. It's a new street. A street in a place. A street."
        said = await line.finish(looped, "neutral", 30)
    assert said == "A street, I see. A street in a place. It's a new street."
    assert [a[1] for a in client.asked] == ["A street, I see.", "A street in a place.", "It's a new street."]


async def test_a_try_after_a_false_start_may_begin_with_the_same_words(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A lone first clause heard before its sentence was refused is a false start, not part of
    the line the next try writes: that try is checked after its own sentences only, so it may
    begin with the same clause (nothing is said twice in the line published)."""
    context = LineContext.of([], "companion_juniper", {"companion_pim": "Pim"}, ["Speak warmly."])
    client, line = checked(context)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "I am not sure how this can be done, Context: 1. More")
        assert line.abandoned and line.said == "I am not sure how this can be done,"
        said = await line.finish("I am not sure how this can be done, but I will try.", "neutral", 30)
    assert said == "I am not sure how this can be done, but I will try."
    clause = "I am not sure how this can be done,"  # heard, then said again from the try's start
    assert [a[1] for a in client.asked] == [clause, clause, "but I will try."]


async def test_a_held_line_admits_its_sentences_and_sends_none_before_the_hold_is_released(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = Client(speaking=0.5)
    hold = trio.Event()
    line = LiveVoiceLine(client.ask, emit, hold=hold)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "The sea is calm. The boats are in. Come")
        await trio.sleep(10)
        assert line.started and line.said == "The sea is calm. The boats are in."
        assert client.asked == []  # written and checked, but nobody hears it yet
        released = trio.current_time()
        hold.set()
        said = await line.finish("The sea is calm. The boats are in. Come and see!", "happy", 30)
    assert said == "The sea is calm. The boats are in. Come and see!"
    assert [text for _at, text, _meta in client.asked] == [
        "The sea is calm.",
        "The boats are in.",
        "Come and see!",
    ]
    assert client.asked[0][0] == released


def checked(context: LineContext, **options: Any) -> tuple[Client, LiveVoiceLine]:
    """A client speaking each sentence in 0.5 s, and a line whose sentences pass the speaker's
    check in ``context``."""
    client = Client(speaking=0.5)
    return client, LiveVoiceLine(client.ask, emit, check=_sentence_check(context), **options)


async def test_a_long_first_clause_is_voiced_while_its_sentence_is_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A one-sentence line is written about as fast as its first clause is said: the first words
    go out at the first clause long enough to stand alone, past the speaker's check (a clause
    does not "stop mid-sentence"); the rest of the line goes a sentence at a time."""
    context = LineContext.of([], "companion_juniper", {"companion_pim": "Pim"}, ["Speak warmly."])
    client, line = checked(context)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "Well, I've been in your shoes, my fr")
        await trio.sleep(0.1)
        assert [text for _at, text, _meta in client.asked] == ["Well, I've been in your shoes,"]
        said = await line.finish("Well, I've been in your shoes, my friend, truly. Come sail.", "warm", 30)
    assert said == "Well, I've been in your shoes, my friend, truly. Come sail."
    assert [text for _at, text, _meta in client.asked] == [
        "Well, I've been in your shoes,",
        "my friend, truly.",
        "Come sail.",
    ]


async def test_a_first_clause_that_begins_an_earlier_sentence_waits_for_its_sentence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Too short for the copy check, a clause that begins a line already said is not voiced
    alone (SmolLM2-135M went on to copy the rest, measured): its sentence is judged whole."""
    before = [
        Message.create("companion_juniper", ["user_mika"], "I'm just a moment of your actions, I'll do it.")
    ]
    context = LineContext.of(before, "companion_juniper", {}, ["Speak warmly."])
    begins = begins_an_earlier_sentence(context)
    client, line = checked(context, clause_alone=lambda clause: not begins(clause))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "I'm just a moment of your actions, I'll do it. And then")
        said = await line.finish("I'm just a moment of your actions, I'll do it. And then?", "neutral", 30)
    assert client.asked == [] and said == ""  # the copied sentence was refused whole


async def test_a_first_clause_whose_sentence_is_refused_is_a_false_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The clause was heard; the line the speaker then says is voiced whole and is what the
    message publishes, not the clause left hanging. With no line after it, the clause is all
    that was said, and is published."""
    context = LineContext.of([], "companion_juniper", {}, ["Speak warmly."])
    client, line = checked(context)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, 'I am not sure how this can be done, Context: {"memory": 1}. More')
        await trio.sleep(5)
        assert line.said == "I am not sure how this can be done,"  # nothing else yet
        said = await line.finish("That is about all I know of the harbour.", "neutral", 30)
    assert said == "That is about all I know of the harbour."
    assert [text for _at, text, _meta in client.asked] == [
        "I am not sure how this can be done,",
        "That is about all I know of the harbour.",
    ]
    assert [meta["part"] for _at, _text, meta in client.asked] == [0, 1]


async def test_a_sentence_refused_only_once_the_stream_ended_leaves_its_clause_a_false_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The first clause was heard while the model wrote; its stream ended, and the rest of the
    sentence, checked as the line was finished, copies a line said before. The clause is not the
    line ("I'm not a superhero," was published, SmolLM2-135M, measured): nothing is said of
    this line, the model is told why, and its next line is voiced from its start."""
    own = "Oh, I keep bees on a city roof and name every queen."
    context = LineContext.of(
        [Message.create("companion_juniper", ["user_mika"], own)], "companion_juniper", {}, ["Speak warmly."]
    )
    client, line = checked(context)
    written = "I'm not a superhero, I just keep bees on a city roof and name every queen."
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, written[:30])
        await trio.sleep(5)
        assert line.said == "I'm not a superhero,"
        assert await line.finish(written, "neutral", 30) == ""
        assert line.refusal is not None and line.refusal.startswith(NOT_SAID)
        said = await line.finish("Bees sleep through the winter.", "neutral", 30)
    assert said == "Bees sleep through the winter."
    assert [text for _at, text, _meta in client.asked] == ["I'm not a superhero,", said]


CARD_LINE = "That is about all I know of the harbour."


@pytest.mark.parametrize(
    ("written", "said", "heard"),
    [
        # each piece passed, the whole line was refused (a copy), the card's own line came
        (
            "I am not sure how this can be done, but I",
            CARD_LINE,
            ["I am not sure how this can be done,", CARD_LINE],
        ),
        # a whole sentence heard is no false start: what was said is what is published
        ("The fog lifted at noon. Then", "The fog lifted at noon.", ["The fog lifted at noon."]),
    ],
)
async def test_a_line_rewritten_after_a_lone_first_clause_is_voiced_anew(
    autojump_clock: trio.testing.MockClock, written: str, said: str, heard: list[str]
) -> None:
    client = Client(speaking=0.5)
    line = LiveVoiceLine(client.ask, emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, written)
        await trio.sleep(5)
        assert await line.finish(CARD_LINE, "neutral", 30) == said
    assert [text for _at, text, _meta in client.asked] == heard


async def test_a_line_settles_as_heard_once_a_later_sentence_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Nothing more of it can be voiced: the model may stop writing, and the line is what was
    heard. A line still growing, or one stopped with nothing heard (its next try starts anew),
    or with only a lone first clause heard (a false start), is not settled."""
    client = Client(speaking=0.5)
    line = LiveVoiceLine(client.ask, emit, check=lambda s, _b: "a copy" if s.startswith("Hello") else None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "Fine. Calm seas. ")
        assert line.settled is None and not line.abandoned
        line.grow(VOICE_TOOL, "Fine. Calm seas. Hello again. And")
        assert line.settled == "Fine. Calm seas." and not line.abandoned and line.refusal is None
        assert await line.finish("Fine. Calm seas.", "neutral", 30) == "Fine. Calm seas."
    assert [a[1] for a in client.asked] == ["Fine.", "Calm seas."]

    unheard = LiveVoiceLine(client.ask, emit, check=lambda s, _b: "a copy" if s.startswith("Hello") else None)
    unheard.grow(VOICE_TOOL, "Hello again. And")
    assert unheard.abandoned and unheard.settled is None
    assert unheard.refusal == "a copy", "the model's next try is told why"

    clause = LiveVoiceLine(client.ask, emit, check=lambda s, _b: "a copy" if "Context" in s else None)
    clause.grow(VOICE_TOOL, "I am not sure how this can be done, Context: 1. More")
    assert clause.said == "I am not sure how this can be done,"
    assert clause.abandoned and clause.settled is None and clause.refusal == "a copy"
    clause.grow(VOICE_TOOL, "Sure.")  # the next try starts anew: nothing refused in it yet
    assert not clause.abandoned and clause.refusal is None


async def test_a_line_refused_whole_settles_as_heard_unless_only_a_clause_was_heard(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every sentence passed but the whole line was refused: what was heard is the line, and
    nothing more of it is voiced (its last sentence, still unchecked, included). Nothing heard,
    or a lone first clause, settles nothing: the model's next try is voiced from its start."""
    client = Client(speaking=0.5)
    line = LiveVoiceLine(client.ask, emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "Fine. Calm seas. Last")
        assert line.settle("the whole line was refused (copy)") == "Fine. Calm seas."
        assert line.settled == "Fine. Calm seas."
        assert await line.finish("Fine. Calm seas.", "neutral", 30) == "Fine. Calm seas."
    assert [a[1] for a in client.asked] == ["Fine.", "Calm seas."]

    assert LiveVoiceLine(client.ask, emit).settle("refused") is None
    clause = LiveVoiceLine(client.ask, emit)
    clause.grow(VOICE_TOOL, "I am not sure how this can be done, but I")
    assert clause.said == "I am not sure how this can be done,"
    assert clause.settle("refused") is None and clause.settled is None and not clause.abandoned


async def test_a_line_cut_short_ends_at_the_sentence_being_said(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stop past its grace: the sentence the client is saying is the line's last, those
    admitted but not sent are dropped, the client's answer is not waited for, and the line
    settles as what was sent. A held line (nothing sent) is not cut: nothing of it was heard."""
    client = Client(speaking=2.0)
    line = LiveVoiceLine(client.ask, emit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(line.run)
        line.grow(VOICE_TOOL, "Fine. Calm seas. Three boats. Last")
        await trio.sleep(3)  # "Fine." said, "Calm seas." being said
        started = trio.current_time()
        assert line.cut_short("stopping")
        assert line.settled == "Fine. Calm seas."
        said = await line.finish("Fine. Calm seas. Three boats. Last one.", "neutral", 30)
        assert said == "Fine. Calm seas."
        assert trio.current_time() - started < 1  # the answer to "Calm seas." not waited for
    assert [a[1] for a in client.asked] == ["Fine.", "Calm seas."]

    held = LiveVoiceLine(client.ask, emit, hold=trio.Event())
    held.grow(VOICE_TOOL, "Fine. Calm seas. ")
    assert not held.cut_short("stopping") and held.settled is None
