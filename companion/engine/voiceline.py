"""The speaker's line voiced a sentence at a time while the model is still writing it.

A streaming model shows the line as it grows (:meth:`LiveVoiceLine.grow`, a
:class:`~companion.models.base.LineSink`); each sentence, once complete
(:class:`~companion.lines.sentences.SentenceSplitter`; the line's first clause, when it is
long enough to be said alone, goes before the rest of its sentence), passes
:meth:`LiveVoiceLine.admit` — the one place every sentence goes through before anyone hears
it — and is sent to the clients as its
own ``speak`` query by :meth:`LiveVoiceLine.run`, one after another, each waited for (so an
aikyo client, which speaks each query as it comes, never speaks two at once). When the model's
call of ``speak_with_voice`` is complete, its handler calls :meth:`LiveVoiceLine.finish`: the
rest of the line is voiced, and the text said is what the ``message.send`` publishes, so that
companions and turn-taking see one whole message, sent once the line has been heard.

A stream that breaks off leaves its half-written sentence unsaid; the speaker then publishes
what was said (:attr:`LiveVoiceLine.said`) and nothing else. A client that stops the voice
answers a sentence ``interrupted`` (see ``companion/rtc/control.py``): nothing more of the line
is voiced, and the line published ends before the sentence that was cut.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from companion.actions.builtins import (
    DEAF_WAIT,
    VOICE_QUERY,
    VOICE_TOOL,
    interrupted,
    sentence_wait,
    voice_metadata,
)
from companion.actions.results import QueryTimeout
from companion.lines.sentences import CLAUSE_MARKS, FIRST_CLAUSE_CHARS, SentenceSplitter, join_sentences
from companion.protocol import QueryResult, new_id

__all__ = ["Ask", "LiveVoiceLine", "SentenceCheck"]

Ask = Callable[[str, Mapping[str, Any] | None, float, Mapping[str, Any] | None], Awaitable[QueryResult]]
"""``ask(type, body, timeout, metadata)``: a query to the clients (``ActionRuntime.ask_clients``)."""
SentenceCheck = Callable[[str, tuple[str, ...]], str | None]
"""``check(sentence, said_before) -> None`` to voice it, or why not (nothing after it is voiced)."""
Emit = Callable[..., None]

_VOICE_TIMEOUT: Final = 100.0


class LiveVoiceLine:
    """One speech's voiced line. Owned by the speaker; :meth:`run` lives in the speaker's nursery."""

    def __init__(
        self,
        ask: Ask,
        emit: Emit,
        *,
        check: SentenceCheck | None = None,
        clause_alone: Callable[[str], bool] = lambda _clause: True,
        voiced: frozenset[str] = frozenset({VOICE_TOOL}),
        clock: Callable[[], float] = trio.current_time,
        hold: trio.Event | None = None,
    ) -> None:
        """``hold``: nothing is sent before it is set (a reply prepared before this companion
        knows it speaks: sentences are admitted and wait, see :meth:`Speaker.prepare
        <companion.engine.speech.Speaker.prepare>`). ``clause_alone``: whether the line's first
        clause may be voiced before its sentence is complete (see
        :class:`~companion.lines.sentences.SentenceSplitter`)."""
        self.id = new_id()
        self._hold = hold
        self._ask, self._emit, self._check, self._voiced, self._clock = ask, emit, check, voiced, clock
        self._clause_alone = clause_alone
        self._splitter = self._new_splitter()
        self._tool: str | None = None
        self._admitted: list[str] = []
        """Sentences that passed :meth:`admit`, in order (sent or waiting to be)."""
        self._false_start = 0
        """How many of :attr:`_admitted` were a false start (a lone first clause whose sentence was
        refused, then another line began): heard, but not part of the line published."""
        self._sent = 0
        self._stopped = False
        """A sentence was refused or the text went back on itself: nothing more is admitted."""
        self._stop_reason = ""
        self._ended = False
        """No sentence will be added any more (the line is complete, cut, or abandoned)."""
        self._emotion = "neutral"
        self._deadline = self._clock() + _VOICE_TIMEOUT
        self._deaf = False
        self._changed = trio.Event()
        self._done = trio.Event()
        self.first_sent: float | None = None
        """When the first sentence went out (trio's clock), for the log and the benchmark."""
        self._asking: trio.CancelScope | None = None
        """The wait for the client's answer to the sentence being said, while there is one."""

    # --- the model's side --------------------------------------------------------------------

    def voices(self, tool_id: str) -> bool:
        """Whether a line of ``tool_id`` is voiced through this live line: not once it ended with
        nothing heard (its one line refused at its first sentence, then finished). A later line of
        the reply (the model's second try, the card's own line) is then voiced on its own, after
        its whole-line check; through this line it could only say nothing, and the slot was given
        up (SmolLM2-135M, whose lines began with a copied first sentence: five turns in five)."""
        spent = self._ended and not self._admitted
        return tool_id in self._voiced and self._tool in (None, tool_id) and not spent

    def _new_splitter(self) -> SentenceSplitter:
        return SentenceSplitter(first_clause=FIRST_CLAUSE_CHARS, clause_alone=self._clause_alone)

    def grow(self, tool_id: str, text: str) -> None:
        """The model's line so far (see :class:`~companion.models.base.LineSink`)."""
        if self._ended or not self.voices(tool_id):
            return
        self._tool = tool_id
        self._anew(text)
        self._take(self._splitter.feed(text))

    def _anew(self, text: str) -> None:
        """A line nobody heard anything of (its first sentence refused) starts over when another
        line comes (the model's next try, or the card's own line): that one is voiced from its
        start. Without this, every later line of the reply was refused as "nothing said" and the
        slot given up (SmolLM2-135M: four turns in five).

        So does a line of which only its first clause was heard, its sentence refused or the whole
        line refused after it: the clause was a false start, as a person begins a sentence and
        says another instead, and the line published is the one said whole (SmolLM2-135M: "I am
        not sure how this can be done," then the line refused as a copy; the clause alone was
        published as the line)."""
        if text.startswith(self._splitter.said):
            return  # the same line, going on (or nothing handed out yet)
        heard = self._heard
        if heard and not self._only_a_clause(heard):
            return
        self._splitter = self._new_splitter()
        self._stopped = False
        self._false_start = len(self._admitted)
        reason = (
            "only a first clause of the line before was heard"
            if heard
            else "nothing of the line before was heard"
        )
        self._emit("voice_line_anew", logging.INFO, line=self.id, reason=reason)

    @property
    def _heard(self) -> list[str]:
        """The sentences of the line being written that passed :meth:`admit` (not a false start)."""
        return self._admitted[self._false_start :]

    @staticmethod
    def _only_a_clause(heard: list[str]) -> bool:
        """Whether ``heard`` is a lone first clause: a false start if its line goes no further."""
        return len(heard) == 1 and heard[0].endswith(tuple(CLAUSE_MARKS))

    @property
    def abandoned(self) -> bool:
        """Whether nothing more of the line being written can be voiced: it was stopped with
        nothing heard but a false start (see :class:`~companion.models.base.LineSink`). A new
        line (the model's next try) may still start anew."""
        return self._stopped and self.settled is None

    @property
    def refusal(self) -> str | None:
        """Why the line was stopped, while it is :attr:`abandoned` (see
        :class:`~companion.models.base.LineSink`)."""
        return self._stop_reason if self.abandoned else None

    @property
    def settled(self) -> str | None:
        """The line, once nothing more of it can be voiced after some of it was heard (a later
        sentence refused, the voice interrupted): exactly what was heard, which is what the
        message publishes. The model may stop writing, and is not asked again: its next try
        could not be voiced (a line once heard never starts over) and what was heard would be
        published anyway, a request later (SmolLM2-135M: a refused second sentence, then 1.1 s
        more writing to the token limit and 0.8 s for a second try nobody heard, measured).
        ``None`` while the line may still grow, or when only a lone first clause was heard and
        a line may still follow it (then it was a false start); once the voice was interrupted
        nothing follows, and the clause is the line."""
        heard = self._heard
        if not self._stopped or not heard or (self._only_a_clause(heard) and not self._ended):
            return None
        return join_sentences(heard)

    def settle(self, reason: str) -> str | None:
        """The line, refused whole after some of it was heard (a rule only a whole line can
        break, such as another's line spliced in): nothing more of it is voiced and what was
        heard is the line, as when a later sentence is refused (:attr:`settled`), since the
        model's next try could not be voiced and what was heard would be published after it
        anyway. ``None``, and nothing changed, when nothing but a lone first clause was heard:
        that was a false start, and the next try is voiced from its start."""
        heard = self._heard
        if not heard or self._only_a_clause(heard):
            return None
        if not self._stopped:
            self._stop(reason)
        return self.settled

    def cut_short(self, reason: str) -> bool:
        """Say nothing more: the sentence being said is the line's last (the client goes on
        saying it), those not yet sent are dropped, and the line is what was sent, as when the
        person interrupts (:attr:`settled`). For a stop that cannot wait for the whole line: the
        message then says what was heard instead of nothing. ``False``, and nothing changed,
        when no sentence was sent yet (a held line, or none written)."""
        said = self._sent + (self._asking is not None)
        if said == 0:
            return False
        if not (self._stopped and self._ended):  # else it ended already (interrupted): as it is
            self._emit("voice_line_cut_short", logging.INFO, line=self.id, said=said, reason=reason)
            del self._admitted[said:]
            self._stopped = self._ended = True
            if self._asking is not None:
                self._asking.cancel()
            self._wake()
        return True

    @property
    def started(self) -> bool:
        """Whether any sentence has been admitted (a client may be hearing it)."""
        return bool(self._admitted)

    @property
    def said(self) -> str:
        """The line as far as it is voiced or being voiced: what may be published (a false start
        only when nothing was voiced after it)."""
        after = self._admitted[self._false_start :]
        return join_sentences(after or self._admitted)

    def admit(self, sentence: str) -> str | None:
        """The one point each complete sentence passes before it is voiced: ``None`` to voice it,
        or why not. Once one is refused, nothing after it is voiced (a line with a hole in it
        says something else)."""
        if self._check is None:
            return None
        return self._check(sentence, tuple(self._heard))  # a false start is not of this line

    def _take(self, sentences: list[str]) -> None:
        if self._splitter.diverged and not self._stopped:
            self._stop("the model rewrote what was already said")
        for sentence in sentences:
            if self._stopped:
                return
            refused = self.admit(sentence)
            if refused is not None:
                self._stop(refused)
                return
            self._admitted.append(sentence)
        if sentences:
            self._wake()

    def _stop(self, reason: str) -> None:
        self._stopped = True
        self._stop_reason = reason
        self._emit(
            "voice_line_stopped", logging.WARNING, line=self.id, said=len(self._admitted), reason=reason
        )

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # --- the handler's and the speaker's side -------------------------------------------------

    async def finish(self, text: str, emotion: str, wait: float) -> str:
        """The line is complete (``text``): voice the rest, wait for it, return what was said."""
        self._emotion = emotion
        self._deadline = min(self._deadline, self._clock() + wait)
        if self._tool is None:
            self._tool = next(iter(self._voiced))
        if not self._ended:
            self._anew(text)
            self._take(self._splitter.finish(text))
            if self.abandoned and self._heard:
                # Its sentence refused after only its first clause was heard (checked once the
                # stream had ended): a false start, not the line. Ended here, the clause was
                # published as the line ("I'm not a superhero,", SmolLM2-135M, measured); the
                # next try is voiced from its start.
                return ""
        self.end()
        with trio.move_on_at(self._deadline):
            await self._done.wait()
        return self.said

    def end(self) -> None:
        """No more sentences: a cut stream keeps only its complete ones (the half-written rest is
        never said). :meth:`run` voices what is admitted and returns."""
        self._ended = True
        self._wake()

    async def run(self) -> None:
        """Send the admitted sentences in order, each once the one before was answered (or its
        wait ran out: then the rest go out without waiting, in order), once the hold is set."""
        if self._hold is not None:
            await self._hold.wait()
        started = self._clock()
        try:
            while True:
                if self._sent < len(self._admitted):
                    await self._send(self._sent)
                    self._sent = min(self._sent + 1, len(self._admitted))
                    continue
                if self._ended:
                    return
                await self._changed.wait()
        finally:
            self._done.set()
            if self._admitted:
                first = None if self.first_sent is None else round((self.first_sent - started) * 1000)
                self._emit(
                    "voice_line",
                    logging.INFO,
                    line=self.id,
                    sentences=len(self._admitted),
                    first_sentence_ms=first,
                    ms=round((self._clock() - started) * 1000),
                    deaf=self._deaf,
                )

    async def _send(self, part: int) -> None:
        sentence = self._admitted[part]
        last = self._ended and part == len(self._admitted) - 1
        left = self._deadline - self._clock()
        wait = max(min(left, DEAF_WAIT if self._deaf else sentence_wait(sentence)), 0.05)
        if self.first_sent is None:
            self.first_sent = self._clock()
        body = {"message": sentence, "emotion": self._emotion}
        asking = self._asking = trio.CancelScope()
        try:
            with asking:
                answer = await self._ask(VOICE_QUERY, body, wait, voice_metadata(self.id, part, last))
        except QueryTimeout:
            if not self._deaf:
                self._emit("voice_timeout", logging.WARNING, line=self.id, part=part, timeout=round(wait, 3))
            self._deaf = True
            return
        finally:
            self._asking = None
        if asking.cancelled_caught:
            return  # cut short (:meth:`cut_short`): this sentence is the last one said
        if interrupted(answer):
            self._emit("voice_interrupted", logging.INFO, line=self.id, part=part)
            del self._admitted[part:]
            self._stopped = self._ended = True
            return
        if answer.error is not None or (answer.result is not None and not answer.result.success):
            error = answer.error or "success=false"
            self._emit("voice_failed", logging.WARNING, line=self.id, part=part, error=error)
