"""One speak call's bookkeeping, and the live line it shows while it streams.

:class:`SpeakTurn` counts what a speak call did (which actions ran, which the triggers asked for,
the lines the engine refused) and decides whether the model is asked again; :class:`Shown` reads
each partial answer for the line so far, shows it to the request's live line, and says when the
rest of the answer is of no use (the live line refused its first sentence).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic_ai.messages import ModelResponse

from companion.log import log_event
from companion.models.base import LineSink, SpeakRequest, ToolSpec
from companion.models.second_try import is_line_refusal
from companion.models.servers import SpeakForm
from companion.models.streaming import partial_line, text_line_ended
from companion.models.structured import speech_args
from companion.text import clip

__all__ = ["Shown", "SpeakTurn", "shown_to"]

_log = logging.getLogger("companion.models.providers")
"""The providers' logger: these events were always theirs."""


class SpeakTurn:
    """Bookkeeping of one speak call: which actions ran, and whether to ask the model again.

    Each action tool runs at most once per turn (a second ``speak`` would be double speech).
    The model is asked again only when it must: a call failed or was malformed, an instructed
    action is still missing, or it looked something up and has not acted yet.
    """

    def __init__(self, tools: Mapping[str, ToolSpec], request: SpeakRequest) -> None:
        self.tools = tools
        self.me = request.me
        self.recipients = list(request.recipients)
        actions = {s.id for s in tools.values() if s.kind == "action"}
        self.instructed: list[str] = [i.tool for i in request.instructions if i.tool in actions]
        self.pending: set[str] = set(self.instructed)
        """Instructed actions not done yet."""
        self.done: set[str] = set()
        """Actions that succeeded this turn."""
        self.needs_fix = False
        self.looked_up = False
        self.text_reply = False
        self.answers = 0
        """Answered requests so far (the turn's budget counts these)."""
        self.problem = "no answer"
        """Why nothing has been done yet, for the error if it stays that way."""
        self.switch_form = False
        """Set when the current form gave nothing usable: the next form gets the rest of the budget."""
        self.prompt = ""
        """The prompt of the current form (a small model's echo of it is not its line)."""
        self.line_refused = ""
        """The engine's refusal of this round's line (:mod:`.second_try`), if it refused one."""
        self.lines_refused = 0
        """Lines of this turn the engine refused."""

    def start_form(self, text_reply: bool) -> None:
        """A new request form: in the text form no tool can be called, so none is awaited."""
        self.text_reply = text_reply
        if text_reply:
            self.pending.clear()

    def new_round(self) -> None:
        self.needs_fix = False
        self.looked_up = False
        self.line_refused = ""

    def failed(self, problem: str) -> None:
        self.needs_fix = True
        self.problem = problem

    def not_said(self, reason: str) -> None:
        """This round's line was not said (:mod:`.second_try`): refused, or no words to say."""
        self.line_refused = reason
        self.lines_refused += 1

    def record(self, spec: ToolSpec, ok: bool, message: str = "") -> None:
        if not ok:
            if is_line_refusal(message):
                self.not_said(message)
            self.failed(f"{spec.id} failed: {clip(message, 80)}")
        elif spec.kind == "knowledge":
            self.looked_up = True
            self.problem = "it only looked things up"
        else:
            self.done.add(spec.id)
            self.pending.discard(spec.id)

    def follow_up(self) -> bool:
        return self.needs_fix or bool(self.pending) or (self.looked_up and not self.done)

    def speech_args(self, name: str) -> dict[str, Any] | None:
        """Input for the tool named ``name`` (on the wire) that says a line to this turn's
        recipients (the line itself a placeholder), or ``None`` when it takes no line."""
        spec = self.tools.get(name)
        return None if spec is None else speech_args(spec, "-", self.recipients)

    def speaking_tool(self) -> tuple[str, ToolSpec] | None:
        """The action that carries a plain-text answer: an instructed one that takes a message,
        else ``speak``, else the first action that takes a message."""
        able = [
            (name, spec)
            for name, spec in self.tools.items()
            if spec.kind == "action" and self.speech_args(name) is not None
        ]
        for wanted in (*self.instructed, "speak"):
            for name, spec in able:
                if spec.id == wanted:
                    return name, spec
        return able[0] if able else None


class Shown:
    """What shows the request's live line each partial answer (a :data:`~.streaming.Partial`)."""

    def __init__(self, live: LineSink, turn: SpeakTurn, form: SpeakForm) -> None:
        speaker = turn.speaking_tool() if form != "tools_required" else None
        self._live, self._turn = live, turn
        self._text_tool = speaker[1].id if speaker is not None else None
        self.stopped = False
        """Whether the last stream was closed before its end (its answer is cut)."""
        self.settled: str | None = None
        """The line the last stream's answer says, when the live line settled it as heard."""
        self.refused: str | None = None
        """Why the live line refused the last stream's line, nothing of it heard: its answer is a
        refused line, not a call to make (the call could only say nothing)."""

    def __call__(self, response: ModelResponse) -> bool:
        turn = self._turn
        found = partial_line(response, turn.tools, self._text_tool, (turn.me.name, turn.me.id))
        self.stopped, self.settled, self.refused = False, None, None
        if found is not None:
            self._live.grow(*found)
            settled = self._live.settled
            # Nothing more of it can be said: the refused line's second try starts now (its first
            # sentence refused), or the line is what was heard (a later one refused), or a text
            # answer's line is complete (what follows its first line is never said); not when the
            # model has written to its token limit (SmolLM2-135M: 1.1-1.5 s more, measured).
            done = self._live.abandoned or settled is not None
            ended = not done and bool(found[1].strip()) and text_line_ended(response)
            if done or ended:
                log_event(
                    _log,
                    "speak_stream_stopped",
                    companion=turn.me.id,
                    written=clip(found[1], 120),
                    settled=settled is not None,
                    ended=ended,
                )
                self.stopped, self.settled = True, settled
                self.refused = self._live.refusal  # (none once settled: then it is not abandoned)
                return False
        return True


def shown_to(request: SpeakRequest, turn: SpeakTurn, form: SpeakForm) -> Shown | None:
    """What shows the request's live line each partial answer (``None``: nothing to show it to)."""
    return None if request.live is None else Shown(request.live, turn, form)
