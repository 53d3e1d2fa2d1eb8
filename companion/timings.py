"""Every deadline of a turn, and the orderings between them that make takeovers safe."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EngineTimings"]


@dataclass(frozen=True, slots=True)
class EngineTimings:
    """Every deadline of a turn, in seconds. Defaults suit a real language model.

    The orderings are what make takeovers safe: a leader gives up on its model before the
    next one's slot begins, and a speaker gives up before the others skip it.
    """

    states_timeout: float = 20.0
    """The leader's budget for ``decide_states``; after it, rule-based states are published."""
    takeover_after: float = 30.0
    """Length of one leader slot: rank ``k`` leads if no states arrived after ``k`` slots."""
    speak_timeout: float = 90.0
    """The speaker's budget for parameters, triggers and speech (tool calls included)."""
    reply_timeout: float = 120.0
    """How long everyone waits for the chosen speaker's reply before the next one speaks (a
    speaker that fails says so at once, and the next one need not wait)."""
    publish_timeout: float = 5.0
    """Handing the states array to the transport (the leader's model time plus this stays
    inside its slot)."""
    pace: float = 0.0
    """A pause before speaking (aikyo waits a moment too); keeps fast models readable."""
    history_limit: int = 20
    """How many recent messages the model sees."""
    routine_quiet_start: float = 5.0
    """No routine fires this long after the engine starts: the directory fills up first, and
    the companions already there are not newcomers."""
    rejoin_grace: float = 30.0
    """A companion back within this long of leaving is not greeted again (nor seen off)."""
    pipeline: bool = True
    """The next turn's model work starts from a voiced line's preview, while it is voiced
    (:mod:`companion.conversation.preview`; models that prepare replies only)."""

    def __post_init__(self) -> None:
        values = (self.states_timeout, self.takeover_after, self.speak_timeout, self.reply_timeout)
        if not all(v > 0 and math.isfinite(v) for v in (*values, self.publish_timeout)):
            raise ValueError(f"timings must be positive and finite: {self}")
        if self.states_timeout + self.publish_timeout >= self.takeover_after:
            raise ValueError(
                "states_timeout + publish_timeout must be shorter than takeover_after "
                "(a leader yields its slot)"
            )
        if self.pace < 0 or self.pace + self.speak_timeout >= self.reply_timeout:
            raise ValueError("pace + speak_timeout must be shorter than reply_timeout (a speaker yields)")
        if not (0 <= self.routine_quiet_start < math.inf and 0 <= self.rejoin_grace < math.inf):
            raise ValueError("routine_quiet_start and rejoin_grace must be 0 or more, and finite")
        if self.history_limit < 1:
            raise ValueError("history_limit must be at least 1")

    @classmethod
    def offline(cls, pace: float = 0.0) -> EngineTimings:
        """Short deadlines for the scripted model (it answers at once)."""
        return cls(
            states_timeout=2.0,
            takeover_after=4.0,
            speak_timeout=8.0,
            reply_timeout=12.0 + pace,
            publish_timeout=1.5,
            pace=pace,
        )

    @classmethod
    def local(cls, pace: float = 0.0) -> EngineTimings:
        """Longer deadlines for a model server on this machine's CPU (llama.cpp, llama-cpp-python,
        Ollama, LM Studio).

        Such a server answers one request at a time, and abandoning one does not free it: it
        computes on, and the next request waits behind it. Measured with SmolLM2-135M behind
        llama-cpp-python on 2 loaded cores: 5-87 s a request (states 8-84 s, parameters 11-87 s,
        speech 5-74 s), so the default 20 s budget for states was cut on most turns and only
        wasted the server's time. A speaker's budget holds parameters, speech and one
        follow-up. Every deadline stays finite, and the orderings hold.
        """
        return cls(
            states_timeout=90.0,
            takeover_after=100.0,
            speak_timeout=240.0,
            reply_timeout=270.0 + pace,
            publish_timeout=5.0,
            pace=pace,
        )
