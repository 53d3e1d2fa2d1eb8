"""Whether a line takes leave: "Good night, all!", "See you tomorrow.", "またね！".

Two rules read it. A conversation in which someone said goodbye begins to close
(:func:`companion.conversation.rules.closing.closing_floor`): SmolLM2-135M's companions said "Good
night, all!" and went on talking for six more replies, measured. And a small model's "this
conversation is over" parameter is believed early on only when the message it answers took
leave (:func:`companion.card.paramfit.plausible_early`).

A false goodbye ends a conversation too soon, so only phrases that take leave count, and not in a
line that ends with a question: "I can see you love the sea", "Tell me later", "Goodbye to
summer" and "Bye for now?" are no goodbyes, nor are "later" or "see you" alone. English and
Japanese, as the cards speak; every farewell of the offline model's phrasebook counts
(tests/test_farewell.py).

Pure.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["takes_leave"]

_ALONE: Final = r"(?=\s*(?:now\b|then\b|[,.!…]|$))"
"""What follows a phrase that takes leave only on its own: "Take care!" does, "I take care of the
garden" does not."""
_LEAVE: Final = re.compile(
    r"\b(?:good ?-?bye|bye(?:-bye)?|(?<!\ba )good ?night(?!['’]s)|night night|sweet dreams"
    r"|see (?:you|ya)(?: all| both| everyone)? (?:later|soon|tomorrow|next time|around|again)"
    r"|catch you later|talk (?:to you )?(?:later|soon|tomorrow)|until next time|till next time"
    r"|(?:farewell|take care|I(?: have to| must| need to|'d better| should| gotta) (?:go|be going|be off)"
    rf"|time (?:for me )?to (?:go|leave)|my cue to (?:go|leave)|off I go|I'm (?:really )?off"
    rf"|signing off){_ALONE}"
    r")\b(?! to\b)"
    r"|さようなら|さよなら|おやすみ|またね|また明日|また今度|じゃあね|それじゃあ、また|バイバイ|失礼します"
    r"|元気でね|行かなくちゃ|またお話し",
    re.IGNORECASE | re.MULTILINE,
)
_QUESTION: Final = re.compile(r"[?？][\s\"'”’»)\]」』）]*$")
_READ: Final = 2000
"""Characters of a line read: a farewell is short, a flood is not read whole."""


def takes_leave(text: str) -> bool:
    """Whether ``text`` takes leave: a farewell phrase in a line that does not end with a
    question (one that does still waits for an answer)."""
    head = text[:_READ]
    return not _QUESTION.search(head.rstrip()) and bool(_LEAVE.search(head))
