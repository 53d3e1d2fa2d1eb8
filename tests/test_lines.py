"""``companion.lines.check.check_line``: what SmolLM2-135M said in place of a line, measured behind
llama-cpp-python (issue 31), is refused; what a companion may fairly say is not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from companion.lines.check import (
    LineContext,
    begins_an_earlier_sentence,
    check_line,
    check_said,
    normalized_words,
    sentences,
)
from companion.protocol import Message

CONVERSATION = LineContext(
    earlier=[
        "Looks like rain tonight",
        "Greetings, welcome to a special treat. I'm all smiles today, friends!",
        "Talks in sea and sky metaphors, listens more than she speaks, and asks one precise question.",
        "こんにちは、今日は何をしていたの？",
    ],
    ids=["companion_pim", "companion_juniper", "companion_ostra", "user_demo"],
    names=["Pim", "Juniper", "Ostra"],
    prompt_texts=[
        "You are the enthusiastic one. Bring energy, ask others what they would bake, and keep "
        "replies short and excited.",
        "Say goodbye as if closing the bakery for the night, with one last cheerful fact.",
    ],
    speaker_lines=["Greetings, welcome to a special treat. I'm all smiles today, friends!"],
)


@pytest.mark.parametrize(
    "said",
    [
        'Context: {"memory": {"conversation": {',  # the prompt's last block, continued
        '{"message": "Hello!", "to": ["companion_ostra"]}',
        "You can use the action tools to improve your voice.",
        "I've just been talking about you with my actions tools, so now it's your turn.",  # SmolLM2
        "That's a good one. I've been told to speak with voice, but I'm not sure about it.",  # SmolLM2
        "I am not sure, I will continue. You can only use what is requested here: 1-2 sentences.",
        "I'm sorry, but I can only speak one or two sentences at a time.",
        "Keep it natural, one to three sentences.",
        "I will say two or three short sentences.",
        "I'm sorry, but I don't have a tool to speak with you.",
        "Juniper (companion_junipe)",  # an id cut short
        "Pim (companion_juniper) -> companion_pir, user_demo: hi",
        "3. Ostra: The tide is high.",
        "Ask companion_ostra what she would bake!",
        "Your role: You are the enthusiastic one.",
        "Bring energy, ask others what they would bake, and keep replies short and excited!",
        # pydantic-ai's retry framing, flattened into the prompt and read aloud
        "Your previous response failed the application's validation (this is automated feedback, "
        "not a message from the user):",
        "(Juniper) I've been thinking about my dog, the little one.",
        "Ostra: The tide was kind today.",
        "(Ostra, the library's archivist) I'm glad to say that you have just asked me.",
        "Hello everyone,",  # the first line of a longer answer, cut off
        '"That is not a line of your own voice." I am sorry for the mistake.',  # the refusal, read aloud
        "It seems I've hit a server error.",
        "Not said, because it repeats what you already said.",  # this check's own reason, again
        "<pyai:retry_feedback>",
        "User: 3 Users",
        "Sender: Thank you, I am glad that our conversation has been so helpful.",
        "My response will not support the application's validation (your previous message failed).",
        '(1) 2: "Ladies and gentlemen, how can I assist you today?"',  # the numbering, garbled
        "(1) 20: I'm glad to say that we are very close.",
        "(Pim: I'm really excited to share with you the wonderful journey of a rainstorm!)",
        "(Your first try was not used)",  # the second try's task, read aloud
        "(Growling)",
        "The conversation is ending.",
        "You've already addressed the user's question in-character, so no need to mention that.",
        "4: The tide is high.",
        "1.",  # a numbered list's first mark, voiced alone as a sentence (SmolLM2-135M)
        "2) ...",
        "- speak_with_voice.",  # the tool's name as a list item (SmolLM2-135M)
        "- Speak_with_voice: You'll be going to the tavern of the local.",
        "I will use speak_with_voice for that.",
        "- The tide is high.",
        # the persona's first sentence ("... a companion in a group conversation with other AI
        # companions and people"), told back (SmolLM2-135M in the demo, 2026-12-05)
        "You are a companion in a group of friends with various personalities.",
        "You're a companion in this role-play, and I'm thrilled to be your partner.",
        "I'm one of the other AI companions here.",
    ],
)
def test_the_prompt_read_aloud_is_not_a_line(said: str) -> None:
    verdict = check_line(said, CONVERSATION)
    assert verdict.kind == "artifact" and not verdict.ok
    assert verdict.reason.startswith("not said, because it ") and "new sentences" in verdict.reason


@pytest.mark.parametrize(
    "said",
    [
        "Greetings, welcome to a special treat. I'm all smiles today, friends!",  # word for word
        "greetings welcome to a SPECIAL treat... I am all smiles today, friend",  # near
        "Talks in sea and sky metaphors, listens more than she speaks, and asks one precise question.",
        "Greetings, welcome to a special treat.",  # one sentence of a line (streamed)
        "こんにちは、今日は何をしていたの？",
        "Greetings, welcome to a special treat. I am all smiles today, friends!",  # contracted or not
    ],
)
def test_a_copy_of_an_earlier_line_is_not_a_line(said: str) -> None:
    verdict = check_line(said, CONVERSATION)
    assert verdict.kind == "copy", said
    assert verdict.similar_to and verdict.reason.startswith("not said, because it repeats")


def test_the_reason_says_whose_line_was_repeated() -> None:
    mine = check_line("Greetings, welcome to a special treat. I'm all smiles today, friends!", CONVERSATION)
    theirs = check_line("Talks in sea and sky metaphors, listens more than she speaks.", CONVERSATION)
    assert "you already said" in mine.reason and "was already said" in theirs.reason


@pytest.mark.parametrize(
    "said",
    [
        "Rain! I love rain, it makes the bread rise slower.",
        "Good night!",  # short lines may come back
        "What would you bake, Juniper?",
        "Welcome! What a treat to see you all smiling.",  # shares words, not the line
        "It was 3.5 kilos of butter. Exactly!",
        "The sea and the sky meet at the horizon, Ostra.",
        "今日はパンを焼いていたよ。",
        "Ostra, what do you think?",
        "(laughs) Pim, you made my day.",
        "Well - that is the sea for you.",  # a dash inside a line
        "Tide-pools and sea-glass, mostly.",
        "At 3:30 the bread comes out.",
        "",
    ],
)
def test_a_line_of_ones_own_passes(said: str) -> None:
    assert check_line(said, CONVERSATION).ok


@pytest.mark.parametrize(
    "said",
    [
        # SmolLM2-135M behind llama.cpp's server, whose sampling has no repetition penalty by
        # default (bench_latency.py --xllamacpp-python, 2026-12-06, measured)
        "A great, great, great, great, great, great, great, great, great, great, great, great.",
        "A little, a little, a little, a little, a little, a little, a little, a little.",
        "A song in a place. A song in a place. It's a song in a place.",
        "A street in a place. A street, I see. A street in a place.",
        "It is so, so huge! It is so, so huge!",
        "It's my own. It is my own.",  # the same sentence, contracted once
        "I can't stop. I cannot stop.",
        "ははは、ははは、ははは、ははは、ははは。",
    ],
)
def test_a_line_that_says_the_same_again_is_not_a_line(said: str) -> None:
    verdict = check_line(said, LineContext())
    assert verdict.kind == "copy" and ("over and over" in verdict.reason or "twice" in verdict.reason)


@pytest.mark.parametrize(
    "said",
    [
        "No, no, no! That is not how bread rises.",
        "Thank you, thank you, thank you!",
        "Ha ha ha ha, you got me there.",
        "Location, location, location.",
        "It was very, very good. Very good indeed.",
        "Yes. Yes! I said yes.",  # short sentences may come back
        "はい、はい、はい。わかりました。",
        "Row, row, row your boat, gently down the stream.",
        "It's Pim's bread. Pim's bread is warm.",  # a name's 's is not "is"
    ],
)
def test_words_said_again_for_emphasis_are_a_line(said: str) -> None:
    assert check_line(said, LineContext()).ok


def test_a_sentence_of_a_streamed_line_is_checked_against_the_line_s_earlier_sentences() -> None:
    """A streamed line is checked a sentence at a time: each after those of the same line
    already said (``said_before``), which are not yet in the conversation."""
    before = ("The tide is out.", "A song in a place.")
    again = check_line("A song in a place.", LineContext(), said_before=before)
    assert again.kind == "copy" and "twice" in again.reason
    assert check_line("The harbour lights are on.", LineContext(), said_before=before).ok
    assert check_line("A song in a place.", LineContext()).ok  # alone, it is a line


OSTRA_BEFORE = (
    "The stars. I've been a part of your story, I can't imagine a story I wouldn't write. I'm so glad "
    "to have been a part of your journey. The stars you've been baking, I'll always remember."
)


def test_two_sentences_of_ones_own_earlier_line_said_again_are_a_copy() -> None:
    """SmolLM2 behind llama.cpp's server: Ostra's seventh line said three long sentences of her
    fourth again, after an opening too short to count. One sentence retold is allowed."""
    context = LineContext(earlier=[OSTRA_BEFORE, "That's remarkable."], speaker_lines=[OSTRA_BEFORE])
    again = (
        "The stars. I've been a part of your story, I can't imagine a story I wouldn't write. I'm so "
        "glad to have been a part of your journey. One small step, I'm going to try."
    )
    verdict = check_line(again, context)
    assert verdict.kind == "copy" and "you already said" in verdict.reason
    once = (
        "Good night, everyone, and thank you for all the stories of the sea tonight. I've been a "
        "part of your story, I can't imagine a story I wouldn't write."
    )
    assert check_line(once, context).ok


def test_sentences_keep_their_marks_and_quotes() -> None:
    assert sentences("Hello there. Wow! 「今日は」と言った。 Ok?") == [
        "Hello there.",
        "Wow!",
        "「今日は」と言った。",
        "Ok?",
    ]
    assert normalized_words("Ｈｅｌｌｏ, WORLD! 今日は") == ["hello", "world", "今", "日", "は"]


@given(st.text(max_size=3000), st.lists(st.text(max_size=500), max_size=30))
def test_any_text_gets_a_verdict(said: str, earlier: list[str]) -> None:
    """Hostile text (lone surrogates, control characters, huge lines) never raises."""
    verdict = check_line(said, LineContext(earlier=earlier, ids=["companion_x"], prompt_texts=earlier[:2]))
    assert verdict.kind in ("ok", "artifact", "copy")


def test_a_huge_conversation_is_read_in_bounded_time() -> None:
    """Only the last lines and the first characters of each are compared (no timing asserted:
    the bound is in what is read)."""
    earlier = [f"line {i} " + "word " * 2000 for i in range(500)]
    assert check_line("word " * 5000, LineContext(earlier=earlier)).kind == "copy"


def test_a_line_that_copies_another_s_long_sentence_and_adds_an_ending_is_a_copy() -> None:
    """Measured: Pim said Juniper's line with a new ending; short turns of phrase may recur."""
    juniper = (
        "I am glad you've joined. I'm not here to tell people what they're doing wrong, but rather to "
        "give them a different perspective on the universe (that is) and show how it has nothing to do "
        "with themselves."
    )
    pim = (
        "I'm glad you've joined! I'm not here to tell people what they're doing wrong, but rather to "
        "give them a different perspective on the universe (that is). And so many of us love you."
    )
    assert check_line(pim, LineContext(earlier=[juniper])).kind == "copy"
    # one's own long sentence again, in a new line, is the model's business; one's own line is not
    longer = f"{pim} We bake bread for the whole street every single morning, long before the sun is up."
    assert check_line(longer, LineContext(earlier=[juniper], speaker_lines=[juniper])).ok
    assert check_line(juniper, LineContext(earlier=[juniper], speaker_lines=[juniper])).kind == "copy"
    intro = LineContext(earlier=["Oh, quick. I should introduce myself: I'm Aki. I keep bees."])
    assert check_line("Hello! I should introduce myself: I'm Bea. I mend clocks.", intro).ok


def test_swapped_persons_do_not_hide_a_copy() -> None:
    """Measured: "I'm ..." answered "You're ..." with the same words."""
    said = LineContext(earlier=["(You're the one making the comment, you've already been told to speak)"])
    assert check_line("I'm the one making the comment, I've already been told to speak.", said).kind == "copy"


def test_contractions_do_not_hide_a_copy() -> None:
    """Measured: SmolLM2-135M's Juniper said Ostra's line again with contractions."""
    said = LineContext(earlier=["You are a guardian of facts, and I am the one who created that."])
    assert check_line("You're a guardian of facts, and I'm the one who created it.", said).kind == "copy"
    assert normalized_words("I'm sure they won't, you've seen") == [
        "i", "am", "sure", "they", "will", "not", "you", "have", "seen"
    ]  # fmt: skip
    assert normalized_words("It's Pim's, it can't be") == ["it", "is", "pim", "s", "it", "can", "not", "be"]


@pytest.mark.parametrize(
    ("said", "kind"),
    [
        ("- I'm Ostra, the library's archivist.", "artifact"),  # said by Pim (SmolLM2-135M)
        ("My name is Juniper, keeper of the light.", "artifact"),
        ("私はオストラです。", "artifact"),
        ("I am Pim, and I bake.", "ok"),
        ("I'm Ostra's friend, you know.", "ok"),
        ("Ostra said she is tired.", "ok"),
    ],
)
def test_a_companion_never_gives_another_companion_s_name_as_its_own(said: str, kind: str) -> None:
    context = LineContext(names=["Ostra", "Pim", "Juniper", "オストラ"], speaker_name="Pim")
    verdict = check_line(said, context)
    assert verdict.kind == kind, verdict.reason
    if kind == "artifact":
        assert "another companion" in verdict.reason


def test_without_the_speaker_s_name_no_name_is_refused() -> None:
    """A name two companions share, or a context built without the speaker's: nothing refused."""
    assert check_line("I'm Ostra, the library's archivist.", LineContext(names=["Ostra"])).ok
    assert check_line("I'm Ostra.", LineContext(names=["Ostra"], speaker_name="ostra")).ok


@pytest.mark.parametrize(
    ("clause", "begins"),
    [
        ("I'm just a moment of your actions,", True),
        ("i am JUST a moment,", True),  # words compared, not spelling
        ("I'm,", False),  # under three words
        ("I'll do it,", True),  # how its second sentence began
        ("I was just a moment of your actions,", True),  # nearly
        ("I'll do it tonight and then more,", True),  # the whole sentence, then more
        ("Just a moment of your actions,", False),  # the middle of a sentence, not its start
        ("The tide is turning,", False),
    ],
)
def test_a_clause_that_begins_an_earlier_sentence(clause: str, begins: bool) -> None:
    earlier = "I'm just a moment of your actions. I'll do it tonight."
    said = [Message.create("companion_juniper", ["user_mika"], earlier)]
    context = LineContext.of(said, "companion_juniper", {}, [])
    assert begins_an_earlier_sentence(context)(clause) is begins


def test_a_line_that_opens_with_ones_own_sentence_again_is_a_copy() -> None:
    """SmolLM2-135M opened three lines in a row with the same two sentences; each line as a whole
    differed enough. Its own sentence later in a line (a fact told again in a goodbye) stays."""
    fact = "I keep bees on a city roof and name every queen."
    said = [Message.create("companion_juniper", ["user_mika"], f"{fact} Good day to you!")]
    context = LineContext.of(said, "companion_juniper", {}, [])
    opens = check_line(f"{fact} Tonight I will bake rye bread for the whole street and sing.", context)
    assert opens.kind == "copy" and "you already said" in opens.reason
    later = check_line(f"Thanks, everyone, for tonight! {fact} Good night!", context)
    assert later.ok, later


# SmolLM2-135M in the demo (scripts/bench_models.py, 2026-12-05): Pim's line, then Juniper's and
# Ostra's spliced from it, each sentence and the whole below the similarity of a copy.
_PIM = (
    "I am so glad you love me and I will be there to make things right. Piranja, I have a lot of "
    "problems in this world we are killing ourselves by using our phones. If someone has an issue "
    "with something it is my job to help them. Mineya, please do not talk about the black sand. "
    "You can talk about other things."
)
_SPLICED = (
    "I am so glad you love me. How can I help? Please don't talk about black sand. I have a lot of "
    "problems in this world we are killing ourselves, and if someone has an issue with something "
    "it is my job to help them, so I will answer your questions today on everything else."
)


def test_a_line_spliced_from_another_s_sentences_is_a_copy() -> None:
    said = [Message.create("companion_pim", ["companion_juniper"], _PIM)]
    verdict = check_line(_SPLICED, LineContext.of(said, "companion_juniper", {}, []))
    assert verdict.kind == "copy" and "was already said" in verdict.reason


@pytest.mark.parametrize(
    "said",
    [
        "Come by tomorrow. Address: 12 Harbour Street, ask for Mo.",
        "Here is the recipe. Instructions: mix the flour, then rest it an hour.",
    ],
)
def test_a_heading_a_character_may_say_counts_only_at_the_line_s_start(said: str) -> None:
    assert check_line(said, CONVERSATION).ok, said


def test_a_reply_that_takes_up_a_few_of_another_s_words_is_a_line() -> None:
    """A reply names what it answers; a third of its runs of words is far more than that."""
    said = [Message.create("companion_pim", ["companion_juniper"], _PIM)]
    context = LineContext.of(said, "companion_juniper", {}, [])
    reply = (
        "Pim, you say we are killing ourselves by using our phones, but mine only ever rings for the "
        "harbour master, and I would miss the tide tables on it."
    )
    assert check_line(reply, context).ok
    # one's own line told again in other words is left to the model (the offline one retells its
    # fact in its goodbye)
    assert check_line(_SPLICED, LineContext.of(said, "companion_pim", {}, [])).ok


@pytest.mark.parametrize(
    "said",
    [
        "If someone asks, you answer with excitement. Your role (Pim): Respond with a smile.",
        "This is how you do it: Speak. Follow these instructions: Respond in character.",
        "I've got this. My name is: Juniper (id) Wherever you come from.",
        "Someone noticed you. A: No, I'm not. B: No way? C: No way! D: No way!",
        "You are telling me everything. (Ostra). I am so glad you're happy. (Pim) The way you talk.",
    ],
)
def test_the_prompt_read_aloud_mid_line_is_not_a_line(said: str) -> None:
    """SmolLM2-135M in the demo: the prompt's headings after a first sentence of its own."""
    assert check_line(said, CONVERSATION).kind == "artifact", said


# SmolLM2-135M in the demo, ``speak`` (scripts/bench_models.py --runs 2 --server-cache, 2026-12-07)
_PIM_CAKE = (
    "You're a friend. I'm glad you asked, I am so excited about this challenge! I would have said I can "
    "bake anything in my life. But not chocolate, but chocolate and cheese."
)


def test_a_line_written_whole_is_judged_as_its_sentences_would_be_voiced() -> None:
    """Each sentence after those before it, as a streamed line's before it is voiced: another's
    sentence said again ends the line there; said again first, the line is refused."""
    said = [Message.create("companion_pim", ["companion_juniper"], _PIM_CAKE)]
    juniper = LineContext.of(said, "companion_juniper", {}, [])
    line = "I'm so glad you asked. But not chocolate, but chocolate and cheese. And with cheese too."
    kept, verdict = check_said(line, juniper)
    assert kept == "I'm so glad you asked." and verdict.kind == "copy"
    assert check_line(line, juniper).ok  # as a whole, the line passed: its copied sentence is short
    pim = LineContext.of(said, "companion_pim", {}, [])
    assert check_said("You're a friend. I'm so excited to be your companion!", pim)[0] == ""
    assert (
        check_said("Oh! But not chocolate, but chocolate and cheese.", juniper)[0] == ""
    )  # "Oh!" is no line
    fresh = "I baked rye this morning. The crust cracked like thin ice."
    assert check_said(fresh, pim) == (fresh, check_line(fresh, pim))


def test_ones_own_sentence_told_again_later_in_a_streamed_line_is_judged_as_in_a_whole_one() -> None:
    """A fact retold in a goodbye passes in a whole line; streamed, the same sentence once came
    alone and was refused, so a voiced goodbye lost it and all after it."""
    fact = "I keep bees on a city roof and name every queen."
    said = [Message.create("companion_juniper", ["user_mika"], f"{fact} Good day to you!")]
    context = LineContext.of(said, "companion_juniper", {}, [])
    goodbye = f"Thanks, everyone, for tonight! {fact} Good night!"
    assert check_line(goodbye, context).ok
    assert check_line(fact, context, said_before=("Thanks, everyone, for tonight!",)).ok
    assert check_said(goodbye, context) == (goodbye, check_line(goodbye, context))
    # after a first clause alone it opens the line: refused, as it is at a line's start
    assert not check_line(fact, context, said_before=("Thanks,",)).ok
    assert not check_line(fact, context).ok


def test_a_latin_name_in_japanese_is_one_word() -> None:
    """ "Juniperはどう思う？" once counted Juniper's seven letters as seven words: a Japanese
    question naming her was taken for a copy of another's line that named her."""
    assert normalized_words("Juniperはどう思う？")[:2] == ["juniper", "は"]
    said = [
        Message.create(
            "companion_pim",
            ["companion_juniper"],
            "えっ！今日はずっとお菓子作りをしていたよ。Juniperはどう思う？",
        )
    ]
    context = LineContext.of(said, "companion_ostra", {}, [])
    assert check_line("Juniperはオーブンについてどう思う？", context).ok
