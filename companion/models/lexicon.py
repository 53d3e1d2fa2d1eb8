"""Words and what they are about: the offline model's small built-in lexicon.

The scripted model is no language model, yet it has to notice what a line is about: "Looks like
rain tonight" is about the weather, "See you tomorrow" is a goodbye, "Oops, I mixed it up" is
flustered. This module holds that knowledge: a few hundred common words grouped into
*concepts* (topics and feelings), a light stemmer so "raining" finds "rain", and readers for
questions, numbers, liveliness and the noun phrase a line is about. Japanese is matched by
substrings. Everything here is a pure function of its input; nothing depends on the seed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "CONCEPTS",
    "FEELINGS",
    "MAX_CHARS",
    "STOPWORDS",
    "Concept",
    "Language",
    "clean",
    "concepts_in",
    "content_stems",
    "cue_concepts",
    "first_concept",
    "has_cjk",
    "is_question",
    "language_of",
    "liveliness",
    "numbers",
    "quantity",
    "sentences",
    "spread",
    "stem",
    "stem_set",
    "stems",
    "things_in",
    "topic_phrase",
    "topical_word",
    "word_set",
    "words",
]

Language = Literal["en", "ja"]

MAX_CHARS: Final = 4000
"""Only this much of any text is read: a huge message costs no more than a long one."""

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\ufeff]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_KANA = re.compile(r"[\u3040-\u30ff]")
_WORD = re.compile(r"[^\W\d_\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af]+(?:['’][^\W\d_]+)?|\d+")
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])")
_YEAR = re.compile(r"(?<!\d)(\d{4})(?!\d)")
_NOUNISH_JA = re.compile(r"[\u30a0-\u30ff\u3400-\u9fff\uf900-\ufaffー]{2,8}")


def word_set(text: str) -> frozenset[str]:
    """The words of ``text`` (a list written as prose, one space apart) as a set."""
    return frozenset(text.split())


def stem_set(text: str) -> frozenset[str]:
    """The stems of the words of ``text`` as a set."""
    return frozenset(stem(w) for w in text.split())


def clean(text: str, limit: int = MAX_CHARS) -> str:
    """``text`` without lone surrogates or control characters, whitespace folded, at most
    ``limit`` characters: safe to hash, match and quote."""
    text = _SURROGATE.sub("", text[: limit * 2])
    text = _CONTROL.sub(" ", text)
    return " ".join(text.split())[:limit]


def has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


def language_of(*texts: str) -> Language:
    """``ja`` when any text holds kana or CJK ideographs, else ``en`` (the two the model writes)."""
    return "ja" if any(_CJK.search(t) for t in texts) else "en"


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` (abbreviations such as "Co." followed by a lowercase word stay
    inside their sentence)."""
    out: list[str] = []
    open_quotes = 0  # 「 and 『 the last sentence opened and has not closed
    for part in _SENTENCE.split(text.strip()):
        part = part.strip()
        if not part:
            continue
        if out and open_quotes > 0:
            out[-1] = f"{out[-1]}{part}"  # 「…。…」: a quote is one piece, whatever it holds
        elif out and part[:1].islower() and not out[-1].endswith(("!", "?", "。", "！", "？")):
            out[-1] = f"{out[-1]} {part}"  # "Crumb & Co. bakery": not a sentence end
        else:
            out.append(part)
            open_quotes = 0
        open_quotes += _quote_balance(part)
    return out


def _quote_balance(text: str) -> int:
    """How many Japanese quotes (「 or 『) ``text`` opens and does not close."""
    return text.count("「") + text.count("『") - text.count("」") - text.count("』")


def words(text: str) -> list[str]:
    """Latin-script words and numbers of ``text``, case-folded, in order."""
    return [w.replace("’", "'") for w in _WORD.findall(text.casefold())]


_SUFFIXES: Final = (
    ("iness", "y"),
    ("ness", ""),
    ("ingly", ""),
    ("ing", ""),
    ("ied", "y"),
    ("ies", "y"),
    ("ily", "y"),
    ("edly", ""),
    ("ed", ""),
    ("es", ""),
    ("ly", ""),
    ("s", ""),
)


@functools.lru_cache(maxsize=8192)
def stem(word: str) -> str:
    """A crude stem, the same for a word's usual inflections ("bake", "baking", "baked").
    Remembered (bounded): reading a card's persona stems each of its words against each concept's
    things, ~140 calls a card, a third of a leader's first turn with 30 unknown companions."""
    w = word.casefold().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    w = w.strip("'")
    for suffix, replacement in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)] + replacement
            break
    if len(w) > 3 and w.endswith("e"):
        w = w[:-1]
    if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "ls":
        w = w[:-1]
    return w


def stems(text: str) -> set[str]:
    return {stem(w) for w in words(text)}


def content_stems(text: str) -> set[str]:
    """Stems of the words that carry meaning (no stopwords, no two-letter words): what two
    texts must share to be about the same thing."""
    return {stem(w) for w in words(text) if w not in STOPWORDS and len(w) > 2 and not w.isdigit()} | {
        w for w in words(text) if w.isdigit() and len(w) == 4
    }


# --- concepts ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Concept:
    """A topic or feeling: what evokes it in a message, and what names it in a card."""

    name: str
    words: frozenset[str]
    """Stems that evoke it in a message."""
    phrases: tuple[str, ...]
    """Several-word expressions that evoke it (matched on whole words)."""
    ja: tuple[str, ...]
    """Japanese substrings that evoke it."""
    cues: frozenset[str]
    """Stems that *mean* it in a property name, description or enum option ("end" means the
    farewell concept there, though "the end of the film" is no goodbye)."""
    related: tuple[tuple[str, float], ...] = ()
    """Concepts a listener also feels, with a weight (a sad line makes a kind listener tender)."""
    things: bool = False
    """Its words name things a list can hold (foods, rooms, colours)."""


def _concept(
    name: str,
    words: str,
    *,
    phrases: str = "",
    ja: str = "",
    cues: str = "",
    related: Mapping[str, float] | None = None,
    things: bool = False,
) -> Concept:
    own = frozenset(stem(w) for w in words.split())
    return Concept(
        name,
        own,
        tuple(p.strip() for p in phrases.split("|") if p.strip()),
        tuple(ja.split()),
        frozenset({stem(name), *(stem(w) for w in cues.split())}),
        tuple((related or {}).items()),
        things,
    )


CONCEPTS: Final[tuple[Concept, ...]] = (
    _concept(
        "weather",
        "weather rain rainy raining rained drizzle shower showers storm stormy thunder lightning "
        "snow snowy snowing sleet hail wind windy breeze gust fog foggy mist misty cloud cloudy "
        "overcast sunny sunshine forecast umbrella humid humidity heatwave chilly freezing frost "
        "frosty temperature rainbow monsoon typhoon hurricane tornado drought damp downpour",
        phrases="cold outside|hot outside|so hot|so cold",
        ja="天気 雨 晴れ 曇 雪 風 嵐 雷 霧 台風 暑い 寒い 傘 天候 梅雨",
        cues="forecast rain climate",
    ),
    _concept(
        "farewell",
        "bye goodbye farewell goodnight cheerio ciao adieu byebye",
        phrases=(
            "see you|see ya|good night|got to go|gotta go|have to go|need to go|must go|talk later|"
            "talk soon|take care|catch you later|until next time|i'm off|time to go|time for bed|"
            "call it a night|signing off|sign off|heading off|head out|leaving now|that's all for"
        ),
        ja="さようなら さよなら またね また今度 じゃあね バイバイ おやすみ 失礼します お疲れ様",
        cues="end ending goodbye bye farewell leave leaving finish close closing sign wrap",
        related={"wistful": 0.4, "tender": 0.4},
    ),
    _concept(
        "greeting",
        "hello hi hey hiya howdy greetings welcome",
        phrases="good morning|good evening|good afternoon|how are you|nice to meet|how's it going",
        ja="こんにちは おはよう こんばんは はじめまして よろしく",
        cues="greet hello introduction",
    ),
    _concept(
        "question",
        "",
        cues="question ask asked asking query inquiry enquiry wonder",
        related={"curious": 0.6},
    ),
    _concept(
        "happy",
        "happy glad joy joyful great wonderful yay hooray delighted pleased cheerful fun "
        "awesome fantastic brilliant excellent smile smiling delight enjoy enjoyed",
        phrases=("good news|so good|so nice|made my day|lovely|feel good|feeling good|got a new|just got a"),
        ja="嬉し うれし 楽し 幸せ 最高 良かった 明る",
        cues="joy glad delighted delight cheerful pleased content positive joyful",
        related={"excited": 0.4, "amused": 0.2, "proud": 0.2, "tender": 0.2},
    ),
    _concept(
        "sad",
        "sad unhappy miss missed missing lonely cry crying cried tears sorrow grief grieve loss "
        "died death depressed heartbroken gloomy miserable upset hurt awful terrible",
        phrases="feel down|feeling down|bad day|rough day|passed away|passed on|put down",
        ja="悲し 寂し さみし 泣 辛い つらい 落ち込",
        cues="sorrow gloomy melancholy unhappy down sad",
        related={"tender": 0.8, "wistful": 0.5, "calm": 0.2},
    ),
    _concept(
        "angry",
        "angry furious annoyed annoying irritated irritating hate rage outraged frustrated "
        "frustrating unfair",
        phrases="fed up|sick of|so mad|mad at|i'm mad",
        ja="怒 ムカ イライラ 腹が立",
        cues="anger annoyed irritated cross furious",
        related={"calm": 0.3, "doubt": 0.2},
    ),
    _concept(
        "afraid",
        "scared fear frightened worried worry nervous anxious panic terrified scary spooky",
        phrases=(
            "afraid of|so afraid|i'm afraid that|i am afraid of|been lost|got lost|gone missing|went missing"
            "|lost my|can't find my"
        ),
        ja="怖 こわ 不安 心配",
        cues="fear scared worried anxious nervous",
        related={"tender": 0.5, "calm": 0.3},
    ),
    _concept(
        "sleepy",
        "tired sleepy exhausted yawn sleep bed bedtime drowsy weary nap asleep",
        ja="眠 疲れ ねむ",
        cues="tired sleep weary drowsy",
        related={"calm": 0.3},
    ),
    _concept(
        "surprised",
        "wow whoa surprise surprising surprised amazing unbelievable incredible shocked astonishing",
        phrases="no way|can't believe|cannot believe",
        ja="びっくり 驚 すごい まさか",
        cues="surprise astonished",
        related={"excited": 0.4, "curious": 0.4, "amused": 0.2},
    ),
    _concept(
        "curious",
        "curious wonder wondering interesting intriguing mystery puzzle explore discover learn",
        phrases="what if|tell me|i wonder",
        ja="気にな 不思議 なぜ どうして 知りたい",
        cues="curiosity interest interested inquisitive",
        related={"question": 0.2},
    ),
    _concept(
        "excited",
        "excited exciting thrilled woohoo eager stoked hyped pumped party celebrate celebration",
        phrases="can't wait|cannot wait",
        ja="ワクワク わくわく 楽しみ",
        cues="excitement enthusiasm enthusiastic energetic bouncy eager lively",
        related={"happy": 0.5},
    ),
    _concept(
        "amused",
        "funny haha hahaha lol joke joking hilarious laugh laughing silly ridiculous pun hehe lmao",
        ja="笑 ウケ 面白",
        cues="amusement humour humor laugh dryly witty",
        related={"happy": 0.3},
    ),
    _concept(
        "calm",
        "calm quiet peaceful relaxed relax still serene steady tranquil softly slow slowly",
        ja="穏やか 静か のんびり ゆっくり",
        cues="neutral steady unhurried serene composed patient even",
    ),
    _concept(
        "dry",
        "",
        cues="sardonic deadpan wry ironic sarcastic dryly laconic",
        related={"amused": 0.2},
    ),
    _concept(
        "flustered",
        "confused confusing oops whoops mistake muddle messed puzzled unclear sorry",
        phrases="mixed up|mix up|mix-up|got it wrong|got that wrong|i don't understand|don't get it",
        ja="間違 わからな 混乱 ごめん",
        cues="confused embarrassed mistake apologise apologize apology fluster",
        related={"doubt": 0.2},
    ),
    _concept(
        "proud",
        "proud finished managed success succeeded won win achievement perfect nailed accomplished "
        "passed graduated",
        phrases="did it|made it|pulled it off",
        ja="できた 誇 成功",
        cues="pride achievement",
        related={"happy": 0.4, "excited": 0.3},
    ),
    _concept(
        "doubt",
        "doubt doubtful unsure maybe perhaps probably supposedly apparently rumour rumor "
        "allegedly claim actually",
        phrases=(
            "i think the|i think it|i think that|i think there|i think they|i think he|i think she|"
            "i think we|i thought|i believe|i guess|wasn't it|isn't it|i heard|they say|i read|"
            "pretty sure|wasn't that|or was it|if i remember"
        ),
        ja="本当 たぶん 多分 確か かな",
        cues="doubtful skeptical sceptical uncertain wrong claim factual accuracy suspicious dubious",
        related={"curious": 0.2},
    ),
    _concept(
        "wistful",
        "remember remembered memory memories nostalgic nostalgia childhood past once",
        phrases="used to|old days|long ago|back then|years ago|when i was",
        ja="懐かし 昔 思い出",
        cues="nostalgic nostalgia memory remember longing",
        related={"tender": 0.3, "calm": 0.2},
    ),
    _concept(
        "tender",
        "thank thanks grateful kind kindness sweet dear gentle care caring hug",
        phrases="thank you",
        ja="ありがとう 優し 感謝",
        cues="warm affectionate gentle grateful kind caring",
        related={"happy": 0.3},
    ),
    _concept(
        "food",
        "cake bread butter flour sugar egg milk cream chocolate cookie biscuit pie tart pastry "
        "croissant muffin cupcake scone bun dough yeast salt honey jam cheese apple banana berry "
        "strawberry lemon vanilla cinnamon tea coffee soup pizza pasta rice noodle sandwich candy "
        "sweets dessert breakfast lunch dinner meal food snack fruit vegetable carrot potato "
        "tomato onion garlic meat fish chicken pancake waffle toast bagel donut doughnut caramel "
        "custard meringue macaron brownie nut almond walnut oats porridge cereal soup stew curry",
        phrases="ice cream",
        ja="ケーキ パン バター 小麦粉 砂糖 卵 牛乳 クリーム チョコ クッキー お菓子 ご飯 料理 紅茶 "
        "コーヒー りんご",
        cues="food ingredient dish meal eat edible recipe snack",
        things=True,
    ),
    _concept(
        "baking",
        "bake baking baked oven recipe knead whisk bakery loaf batter",
        ja="焼 オーブン レシピ",
        cues="bake",
        related={"food": 0.3},
    ),
    _concept(
        "sky",
        "star sky moon planet saturn jupiter mars venus comet meteor galaxy telescope "
        "constellation orbit eclipse astronomy universe space",
        ja="星 空 月 惑星 宇宙 望遠鏡",
        cues="astronomy stars",
    ),
    _concept(
        "sea",
        "sea ocean wave tide ship boat sail sailor harbour harbor beach shore coast lighthouse island",
        ja="海 波 船 港 灯台 島",
        cues="ocean maritime",
    ),
    _concept(
        "books",
        "book library read reading novel author page chapter archive catalogue catalog footnote "
        "poem poetry librarian",
        ja="本 図書館 読 小説",
        cues="book reading literature",
    ),
    _concept(
        "history",
        "history historical invented ancient century era",
        phrases="was founded|founded in|was built in|was invented",
        ja="歴史 年 世紀",
        cues="history date year fact",
        related={"doubt": 0.2},
    ),
    _concept(
        "music",
        "music song sing singing guitar piano melody band concert tune",
        ja="音楽 歌",
        cues="music song",
    ),
    _concept(
        "animals",
        "dog cat bird horse pet puppy kitten fox owl whale dolphin rabbit",
        ja="犬 猫 鳥",
        cues="animal pet",
        things=True,
    ),
    _concept(
        "rooms",
        "kitchen bedroom bathroom hall hallway office garage attic basement study lounge porch",
        phrases="living room|dining room",
        ja="台所 寝室 居間 玄関",
        cues="room place location",
        things=True,
    ),
    _concept(
        "colours",
        "red green yellow orange purple pink white black grey gray brown violet",
        ja="赤 緑 黄色 紫 白 黒",
        cues="colour color",
        things=True,
    ),
    _concept(
        "energy",
        "",
        cues="energy lively liveliness excitement enthusiasm engagement intensity active buzz vivid",
    ),
)

_BY_NAME: Final = {c.name: c for c in CONCEPTS}


def _phrase_in(phrase: str, folded: str) -> bool:
    if phrase not in folded:  # most phrases are absent: no pattern built for them
        return False
    return re.search(rf"(?<![\w']){re.escape(phrase)}(?![\w'])", folded) is not None


def concepts_in(text: str) -> dict[str, float]:
    """How strongly ``text`` evokes each concept (hits; the question concept counts 1 for a
    question). Only concepts with hits appear. The dict is the caller's own."""
    return dict(_concepts_in(text))


@functools.lru_cache(maxsize=1024)
def _concepts_in(text: str) -> tuple[tuple[str, float], ...]:
    """:func:`concepts_in`, remembered: a leader's model rates one message for each addressed
    companion (30 companions asked it 30 times: ~20 ms of a 2-core machine's CPU a turn), and
    the phrasing asks it again of the same words. Bounded, and immutable (callers edit copies)."""
    folded = text.casefold().replace("’", "'")
    own = [stem(w) for w in words(folded)]
    found: dict[str, float] = {}
    for concept in CONCEPTS:
        hits = sum(1 for s in own if s in concept.words)
        hits += sum(1 for p in concept.phrases if _phrase_in(p, folded))
        hits += sum(1 for j in concept.ja if j in text)
        if hits:
            found[concept.name] = float(hits)
    if any(1000 <= int(y) <= 2100 for y in _YEAR.findall(text)):
        found["history"] = found.get("history", 0.0) + 1.0  # a date: a factual claim
    if is_question(text):
        found["question"] = 1.0
    return tuple(found.items())


FEELINGS: Final = (
    "happy", "sad", "angry", "afraid", "sleepy", "surprised", "curious", "excited", "amused", "calm",
    "dry", "flustered", "proud", "doubt", "wistful", "tender",
)  # fmt: skip
"""The concepts that are feelings (the rest are topics)."""


def cue_concepts(text: str) -> dict[str, float]:
    """Concepts that ``text`` (a property name, description or enum option) is *about*."""
    own = [stem(w) for w in words(re.sub(r"[_\-]+|(?<=[a-z])(?=[A-Z])", " ", text))]
    found: dict[str, float] = {}
    for concept in CONCEPTS:
        hits = sum(1 for s in own if s in concept.cues or s in concept.words)
        hits += sum(1 for j in concept.ja if j in text)
        if hits:
            found[concept.name] = float(hits)
    return found


def first_concept(text: str, among: Iterable[str]) -> str | None:
    """The concept of ``among`` that ``text`` evokes first, reading from the start ("Sardonic,
    precise and secretly kind" is first of all dry): a card's lead trait."""
    wanted = [c for c in CONCEPTS if c.name in set(among)]
    best: tuple[int, str] | None = None
    for index, word in enumerate(words(text)):
        found = {**cue_concepts(word), **concepts_in(word)}
        hit = next((c.name for c in wanted if c.name in found), None)
        if hit is not None:
            best = (index, hit)
            break
    if has_cjk(text):  # Japanese: the earliest cue in the text, by character position
        for concept in wanted:
            for cue in concept.ja:
                at = text.find(cue)
                if at >= 0 and (best is None or at < best[0]):
                    best = (at, concept.name)
    return None if best is None else best[1]


def spread(found: Mapping[str, float]) -> dict[str, float]:
    """``found`` plus what a listener feels along with it (the concepts' ``related`` weights)."""
    out = dict(found)
    for name, hits in found.items():
        concept = _BY_NAME.get(name)
        for other, weight in concept.related if concept is not None else ():
            out[other] = out.get(other, 0.0) + min(hits, 2.0) * weight
    return out


def things_in(concept: str, texts: Iterable[str]) -> list[str]:
    """The words (or phrases) of ``concept`` that ``texts`` name, lowercase, first seen first."""
    known = _BY_NAME.get(concept)
    if known is None:
        return []
    out: list[str] = []
    for text in texts:
        folded = text.casefold()
        phrases = [p for p in known.phrases if p in folded]  # most are absent: no pattern built
        found = [(m.start(), p) for p in phrases for m in re.finditer(rf"\b{re.escape(p)}\b", folded)]
        for match in _WORD.finditer(folded):
            if stem(match.group()) in known.words and not any(
                start <= match.start() < start + len(p) for start, p in found
            ):
                found.append((match.start(), match.group()))
        found.extend((text.find(j), j) for j in known.ja if j in text)
        for _, item in sorted(found):
            if item not in out:
                out.append(item)
    return out


# --- questions, numbers, liveliness ----------------------------------------------------------------

_QUESTION_OPENERS: Final = word_set(
    """what why how who whom whose where when which do does did are is was were can could would will
    should shall may might have has had isn't aren't don't doesn't didn't won't"""
)
_JA_QUESTION = re.compile(r"(か|かな|かしら|でしょう|だろう|っけ)[。\s]*$")


def is_question(text: str) -> bool:
    """Whether ``text`` ends by asking something: its last sentence has a question mark, opens
    with a question word ("how are you today"), says "tell me about ...", or has a Japanese
    question ending. ("Rain? Then stay in." is no question: it only echoes.)"""
    parts = sentences(text)
    if not parts:
        return False
    last = parts[-1]
    if last.rstrip().endswith(("?", "？")) or (("?" in last or "？" in last) and len(parts) == 1):
        return True
    first = words(last)[:2]
    if (
        first
        and first[0] in _QUESTION_OPENERS
        and len(words(last)) >= 3
        and not last.rstrip().endswith(("!", "."))
    ):
        return True
    if first[:2] == ["tell", "me"]:
        return True
    return bool(_KANA.search(last)) and _JA_QUESTION.search(last) is not None


_NUMBER_WORDS: Final = {
    "zero": 0, "none": 0, "once": 1, "one": 1, "a": 1, "single": 1, "twice": 2, "two": 2,
    "couple": 2, "pair": 2, "thrice": 3, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "dozen": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "half": 50,
}  # fmt: skip
_DIGITS = re.compile(r"-?\d+(?:\.\d+)?")


def numbers(text: str) -> list[tuple[int, float]]:
    """``(word index, value)`` of every number in ``text``, digits or words ("three", "twice").

    "a" counts only before a unit-like word ("a dozen" is 12 through "dozen"; "a cake" is not 1).
    """
    found: list[tuple[int, float]] = []
    tokens = words(text)
    for index, token in enumerate(tokens):
        if _DIGITS.fullmatch(token):
            found.append((index, float(token)))
        elif token in _NUMBER_WORDS and token != "a":
            found.append((index, float(_NUMBER_WORDS[token])))
    return found


_PIECE = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?|\d+(?:\.\d+)?|-")
_REACH: Final = 3
"""How many words after a number (and half as far before it) it may count."""


def quantity(text: str, meaning: Iterable[str]) -> float | None:
    """The number ``text`` gives for something whose words stem to ``meaning``, or ``None``.

    A number counts the word it is hyphened to, and only that ("six-sided": six sides), else the
    nearest word after it (a hyphened pair counting as one word: "two six-sided dice" is two
    dice), else one just before it ("dice: two"). So "roll two six-sided dice" gives 2 for
    ``{"dice"}`` and 6 for ``{"sides"}``, where a window of words would give both the same.
    """
    wanted = {stem(m) for m in meaning}
    pieces = _PIECE.findall(text.casefold()[:MAX_CHARS])
    units: list[tuple[str, str | None]] = []  # (word, the word it is hyphened to)
    index = 0
    while index < len(pieces):
        piece = pieces[index]
        if piece == "-":
            index += 1
            continue
        joined = index + 2 < len(pieces) and pieces[index + 1] == "-" and pieces[index + 2] != "-"
        units.append((piece, pieces[index + 2] if joined else None))
        index += 3 if joined else 1
    best: tuple[float, float] | None = None  # (distance, value)
    for at, (word, partner) in enumerate(units):
        value = _number_value(word)
        if value is None:
            continue
        if partner is not None:
            if stem(partner) in wanted and (best is None or best[0] > 0.5):
                best = (0.5, value)
            continue
        nearby = [(float(d), at + d) for d in range(1, _REACH + 1)]
        nearby += [(d * 2.0 - 0.5, at - d) for d in range(1, 2)]
        for distance, where in nearby:
            if 0 <= where < len(units) and stem(units[where][0]) in wanted:
                if best is None or distance < best[0]:
                    best = (distance, value)
                break
    return None if best is None else best[1]


def _number_value(word: str) -> float | None:
    if _DIGITS.fullmatch(word):
        return float(word)
    return float(_NUMBER_WORDS[word]) if word in _NUMBER_WORDS and word != "a" else None


_FLAT: Final = word_set(
    """ok okay hmm hm mm meh fine whatever anyway yeah yep sure guess boring quiet dull nothing"""
)


def liveliness(text: str) -> float:
    """How lively a line sounds, 0 (flat: "ok", "hmm, I guess") to 1 (excited, exclaiming)."""
    own = words(text)
    if not own and not has_cjk(text):
        return 0.1
    found = concepts_in(text)
    score = 0.45
    score += min(text.count("!") + text.count("！"), 2) * 0.15
    score += 0.1 if "question" in found else 0.0
    score += 0.15 if {"excited", "happy", "surprised", "amused", "proud"} & found.keys() else 0.0
    score += 0.1 if len(text) > 80 else 0.0
    flat = sum(1 for w in own if w in _FLAT)
    score -= min(flat, 2) * 0.2
    if {"sleepy", "farewell"} & found.keys():
        score -= 0.2
    if len(own) <= 2 and "!" not in text and "?" not in text and not has_cjk(text):
        score -= 0.2
    return max(0.0, min(1.0, score))


# --- what a line is about ----------------------------------------------------------------------------

STOPWORDS: Final = word_set(
    """a an the and or but if then so of to in on at by for with from about into over under up down out
    off as than too very just really quite also even still again ever never always i me my mine
    myself you your yours yourself we us our ours they them their he him his she her it its this
    that these those there here what why how who whom whose where when which do does did done doing
    am is are was were be been being have has had having can could would will should shall may might
    must let lets let's i'm you're it's that's what's there's don't doesn't didn't isn't aren't
    wasn't weren't won't can't i've you've i'd you'd i'll you'll not no yes yeah oh ah hmm well ok
    okay hey hi hello mm mhm ooh wow um uh please thanks thank some any all every each much many more
    most other another
    such only own same both few lot lots kind sort thing things something anything nothing
    everything everyone everybody someone somebody anyone anybody one ones today tonight tomorrow
    yesterday now later soon day night morning evening week time times like likes liked look looks
    looked seem seems think thought know knew tell told say said says get got go going gone went
    come came make made want wanted see saw way way's maybe perhaps probably actually favourite
    favorite best good great nice lovely new old big small little bit far next last first"""
)
_DETERMINERS: Final = word_set("""a an the my your our their his her this that these those some""")
_ADJECTIVES: Final = word_set(
    """best favourite favorite good great nice lovely new old big small little last first next"""
)
_FUNCTION: Final = word_set(
    """a an the and or but if so of to in on at by for with from as than i me you we us they them he
    him she her it this that what why how who where when which do does did am is are was were be
    been have has had can could would will should shall may might must not no"""
)
_SWAP: Final = {"my": "your", "your": "my", "mine": "yours", "yours": "mine"}
_BEFORE_VERB: Final = word_set("to you i we they")
_WH_DETERMINERS: Final = word_set("which what whose")
"""Asking words that can stand before a noun ("which season", "what song"): the noun is said
back with "the" (never "all I know of season")."""
_DO: Final = word_set("do does did can could will would should")
_PREPOSITIONS: Final = word_set("with like to at about for into by from than")
_PROPER: Final = word_set("saturn jupiter mars venus mercury neptune uranus pluto")
_NOT_TOPICS: Final = word_set(
    """makes making taught teaches teach found finds gave gives took takes kept keeps heard hears
    felt feels brought brings bought buys caught catches sang sings wrote writes spoke speaks ran
    runs ate eats drank drinks sat sits stood stands met meets lost loses won wins left leaves
    loud busy hard fast late early alone together away"""
)
"""Words a topic never is, which look like nouns to the rules below: verbs ("what makes you
laugh", "who taught you": the irregular past, the third person) and adverbs ("out loud")."""
_OBJECTS: Final = word_set("you me us him them it")
"""A word right before one of these is a verb ("makes you laugh"), not a topic."""
_TIME_NOUNS: Final = word_set("morning evening afternoon night day")
"""Stop words that end a topic after its adjective ("a rainy morning")."""


_TOPIC_CHARS: Final = 48
_WORD_CHARS: Final = 24


def topic_phrase(text: str, names: Iterable[str] = (), *, swap: bool = False) -> str | None:
    """The short noun phrase ``text`` is about, as it is written there ("the lighthouse",
    "an old map", "rain"), or ``None``. Names of people present never count; with ``swap``,
    "my"/"your" trade places so the phrase can be said back ("your dog" for "my dog").

    It is picked from the last question if there is one, else from the whole text: a run of
    up to three content words, the adjectives and determiner before it, an ``of`` phrase after
    it; runs with known topic words and a determiner win.
    """
    if has_cjk(text):
        return _topic_ja(text)  # Latin words in it are names ("Pimはどう?")
    parts = sentences(text) or [text]
    if is_question(text):
        parts = parts[-1:]
    else:
        parts = [p for p in parts if not p.rstrip().endswith(("?", "？"))] or parts
    skip = {n.casefold() for n in names}
    best: tuple[float, list[str]] | None = None
    for sentence in parts:
        found = _best_run(sentence, skip)
        if found is not None and (best is None or found[0] > best[0]):
            best = found
    if best is None:
        return None
    chosen = best[1]
    if swap:
        chosen = [_SWAP.get(t.casefold(), t) for t in chosen]
    phrase = " ".join(chosen)
    if not phrase or len(phrase) > _TOPIC_CHARS or any(len(t) > _WORD_CHARS for t in chosen):
        return None  # no one says back a 4,000-letter word
    return phrase


def _best_run(sentence: str, skip: set[str]) -> tuple[float, list[str]] | None:
    tokens = re.findall(r"[^\W\d_]+(?:['’][^\W\d_]+)?|\d+|[^\w\s]", sentence)
    folded = [t.casefold().replace("’", "'") for t in tokens]
    best: tuple[float, int, int, bool] | None = None  # (score, start, end, asked which one)
    asked = sentence.rstrip().endswith(("?", "？"))
    index = 0
    while index < len(tokens):
        if not _content(folded[index], skip):
            index += 1
            continue
        if index > 0 and folded[index - 1] in _BEFORE_VERB:
            index += 1  # "used to sail", "would you bake", "I miss": a verb, not a topic
            continue
        end = index
        while end + 1 < len(tokens) and _content(folded[end + 1], skip) and end - index < 1:
            end += 1
        following = folded[end + 1] if end + 1 < len(tokens) else ""
        if following in _OBJECTS:
            end -= 1  # "what makes you laugh": the last word is a verb
            if end < index:
                index += 1
                continue
        elif end > index and (following in _PREPOSITIONS or following in _DETERMINERS):
            end -= 1  # "rain compare with", "season smells the best": the last word is a verb
        elif end > index and asked and index == 2 and folded[1] in _DO and not following[:1].isalpha():
            end -= 1  # "why do stars twinkle?": the last word is the verb
        elif following in _TIME_NOUNS and end - index < 1:
            end += 1  # "a rainy morning"
        start = index
        while start > 0 and folded[start - 1] in _ADJECTIVES and index - start < 2:
            start -= 1
        if start > 1 and folded[start - 1].endswith("ed") and folded[start - 2] in _DETERMINERS:
            start -= 1  # "a tired friend": an adjective, since a determiner comes before it
        determined = start > 0 and folded[start - 1] in _DETERMINERS
        asked_which = not determined and start > 0 and folded[start - 1] in _WH_DETERMINERS
        start -= 1 if determined else 0
        if end + 2 < len(tokens) and folded[end + 1] == "of":
            after = end + 2
            if folded[after] in _DETERMINERS and after + 1 < len(tokens):
                after += 1
            if _nounish(folded[after], skip):
                end = after
        known = sum(1 for t in folded[start : end + 1] if concepts_in(t))
        score = (end - start + 1) * 0.5 + 2 * known + (1 if determined else 0)
        if best is None or score > best[0]:
            best = (score, start, end, asked_which)
        index = end + 1
    if best is None:
        return None
    chosen = tokens[best[1] : best[2] + 1]
    first = chosen[0].casefold()
    if (
        best[1] == 0
        and chosen[0][:1].isupper()
        and first not in _PROPER
        and (first in STOPWORDS or first in _DETERMINERS or concepts_in(first) or first in _ADJECTIVES)
    ):
        chosen[0] = chosen[0][:1].lower() + chosen[0][1:]  # "Rain tonight": not a name
    if best[3]:
        chosen.insert(0, "the")  # "which season smells best": said back as "the season"
    return best[0], chosen


_TOPICAL: Final = ("food", "baking", "sky", "sea", "books", "music", "animals", "weather", "rooms", "colours")
_VERBS: Final = word_set("""bake bakes knead whisk sail sails read reads sing sings rains snows""")


def topical_word(text: str, names: Iterable[str] = ()) -> str | None:
    """The thing a line is about, as one known noun ("butter", "the library", "rain"): from the
    last sentence that names one. For lines whose other words are only framing."""
    skip = {n.casefold() for n in names}
    concepts = [c for c in CONCEPTS if c.name in _TOPICAL]
    for sentence in reversed(sentences(text) or [text]):
        tokens = re.findall(r"[^\W\d_]+(?:['’][^\W\d_]+)?", sentence)
        for index, token in enumerate(tokens):
            folded = token.casefold().replace("’", "'")
            if folded in skip or folded.endswith(("ing", "ed", "'s")) or folded in _VERBS:
                continue
            if not any(stem(folded) in c.words for c in concepts):
                continue
            start = index
            if index and token[:1].isupper():  # "the Halden City Library": the whole name
                while (
                    start > 0 and tokens[start - 1][:1].isupper() and tokens[start - 1].casefold() not in skip
                ):
                    start -= 1
            before = tokens[start - 1].casefold() if start else ""
            phrase = tokens[start : index + 1]
            if start == index and folded not in _PROPER:
                phrase = [folded]
            if before in ("a", "an", "the"):
                phrase.insert(0, before)
            elif before in _DETERMINERS and start == index and folded not in _PROPER:
                phrase.insert(0, "the")  # "your dog": whose depends on who says it back
            return " ".join(phrase)
    return None


def _content(folded: str, skip: set[str]) -> bool:
    return (
        folded[:1].isalpha()
        and folded not in STOPWORDS
        and folded not in _NOT_TOPICS
        and folded not in skip
        and not folded.endswith("ly")
        and len(folded) > 1
        and (not folded.endswith("ing") or bool(concepts_in(folded)))
        and not (folded.endswith("ed") and len(folded) > 4)
    )


def _nounish(folded: str, skip: set[str]) -> bool:
    return folded[:1].isalpha() and folded not in _FUNCTION and folded not in skip and len(folded) > 2


_TIME_JA: Final = re.compile(r"^(?:今日|明日|昨日|今夜|毎日|毎晩|最近|今週|先週|昨夜|今)")
_NOT_TOPIC_JA: Final = ("", "元気", "今日", "明日", "昨日", "今夜", "毎日", "今", "一日", "皆", "何", "私")


def _topic_ja(text: str) -> str | None:
    """The first known (else the longest) run of kanji or katakana: neither a time ("今日") nor a
    greeting ("今晩は") is what a line is about."""
    runs: list[str] = [
        r
        for r in (_TIME_JA.sub("", r) for r in _NOUNISH_JA.findall(text))
        if len(r) <= _WORD_CHARS
        and r not in _NOT_TOPIC_JA
        and not {"greeting", "farewell"} & set(concepts_in(r))
    ]
    if not runs:
        return None
    known = [r for r in runs if concepts_in(r)]
    return (known or sorted(runs, key=len, reverse=True))[0]
