"""Routines: a card's tools that start on their own, on a clock, on silence or on an event.

A card's ``routines`` each name a tool and one trigger: ``every`` (an interval), ``idle``
(seconds without a message) or ``on`` (a companion ``joined`` or ``left``, or a ``message``),
with an optional CEL guard ``when`` and the tool's input (``input`` as given, ``args`` computed
by CEL when the routine fires). Everything is checked when the card loads
(:func:`compile_routines`), like the card's conditions.

:class:`RoutineScheduler` is the whole timing logic, pure and without a clock of its own: it is
told what happened (:meth:`~RoutineScheduler.observe`) and asked what is due now
(:meth:`~RoutineScheduler.due`), and says when to ask next (:meth:`~RoutineScheduler.deadline`).
The shell around it (the engine) runs each :class:`Firing` through the action runtime and reports
:class:`RoutineFinished`, or hands a firing it could not start back
(:meth:`~RoutineScheduler.give_back`). Bounds, per routine: never two firings at once, never two
within its ``cooldown`` (an ``every`` routine's cooldown is its interval), at most ``max_fires``
in a run, and at most :data:`MAX_PENDING` event firings waiting. A routine whose tool speaks (an action on
``messages``) never fires while a conversation is busy: it waits, up to ``max_wait``, for it to
go quiet.

CEL variables, for the guard and ``args`` of every routine:

================  ==================  ====================================================
``me``            string              this companion's id
``companions``    list(string)        ids of the other companions present, sorted
``busy``          bool                a conversation is running
``idle_seconds``  double              seconds since the last message anyone sent
``fired``         int                 how many times this routine has fired in this run
================  ==================  ====================================================

plus, for ``on: message``: ``text`` (string), ``sender`` (string), ``to`` (list(string)),
``addressed`` (bool: ``me`` is in ``to``) and ``metadata`` (map(string, dyn)); and for ``on:
joined`` / ``on: left``: ``companion_id`` and ``companion_name`` (strings).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from cel_expr_python import cel
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from companion.actions import ActionDef, KnowledgeDef
from companion.card.triggers import TriggerProblem, cel_env, compile_cel, eval_bool
from companion.log import log_event
from companion.protocol import Message

__all__ = [
    "DEFAULT_EVENT_COOLDOWN",
    "DEFAULT_MAX_FIRES",
    "DEFAULT_MAX_WAIT",
    "MAX_PENDING",
    "CompanionJoined",
    "CompanionLeft",
    "CompiledRoutine",
    "ConversationBusy",
    "ConversationIdle",
    "Firing",
    "MessageSeen",
    "Routine",
    "RoutineError",
    "RoutineEvent",
    "RoutineFinished",
    "RoutineKind",
    "RoutineScheduler",
    "compile_routines",
    "parse_duration",
]

logger = logging.getLogger("companion.card.routines")

RoutineKind: TypeAlias = Literal["every", "idle", "joined", "left", "message"]
PathPart: TypeAlias = str | int

DEFAULT_EVENT_COOLDOWN: Final = 10.0
"""Seconds between two firings of an ``on`` routine unless its card says otherwise."""
DEFAULT_MAX_FIRES: Final = 100
"""Firings of one routine in one run unless its card says otherwise."""
MAX_FIRES_LIMIT: Final = 10_000
DEFAULT_MAX_WAIT: Final = 120.0
"""Seconds a firing may wait for a busy conversation to go quiet before it is dropped."""
MAX_PENDING: Final = 8
"""Event firings one routine keeps waiting (the earliest; later events are dropped and counted)."""
_MAX_LEFT: Final = 1024
"""Departures remembered for the rejoin grace."""
MIN_INTERVAL: Final = 1.0
MAX_INTERVAL: Final = 7 * 24 * 3600.0
MAX_WAIT_LIMIT: Final = 24 * 3600.0

_DURATION: Final = re.compile(
    r"^\s*(?:(?P<h>\d+(?:\.\d+)?)\s*h)?\s*(?:(?P<m>\d+(?:\.\d+)?)\s*m)?\s*(?:(?P<s>\d+(?:\.\d+)?)\s*s)?\s*$"
)
_DURATION_FIX: Final = "write seconds (e.g. 300) or a duration such as 45s, 5m, 1h or 1h30m"
_UNJSON_TYPES: Final = ("BYTES", "DURATION", "TIMESTAMP", "TYPE")


def _duration_field(description: str) -> Any:
    return Field(default=None, description=description, json_schema_extra={"type": ["number", "string"]})


class Routine(BaseModel):
    """One routine of a card: a tool, one trigger, an optional guard and the tool's input."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(
        min_length=1, description="A tool listed under actions or knowledge (name or reference)."
    )
    name: str | None = Field(default=None, min_length=1, description="A name for logs (default: tool#index).")
    every: Any = _duration_field("Fire at this interval: seconds, or 45s, 5m, 1h, 1h30m.")
    idle: Any = _duration_field("Fire after this much silence (no message from anyone).")
    on: Literal["joined", "left", "message"] | None = Field(
        default=None, description="Fire when a companion joined or left, or on a message from another."
    )
    when: str | None = Field(default=None, description="A CEL guard; the routine fires only when it is true.")
    input: dict[str, Any] = Field(default_factory=dict, description="The tool's input, as given.")
    args: dict[str, str] = Field(
        default_factory=dict, description="Input fields computed by CEL when the routine fires."
    )
    cooldown: Any = _duration_field("Least time between two firings (default: the interval, or 10 s).")
    max_fires: int = Field(
        default=DEFAULT_MAX_FIRES, ge=1, le=MAX_FIRES_LIMIT, description="Most firings in one run."
    )
    max_wait: Any = _duration_field("How long a firing may wait for a busy conversation (default 2m).")


class RoutineError(ValueError):
    """Some routines cannot be used; ``problems`` lists every one (paths inside ``routines``)."""

    def __init__(self, problems: Sequence[TriggerProblem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(p.message for p in self.problems))


def parse_duration(value: object) -> float | None:
    """Seconds from ``300``, ``"300"``, ``"45s"``, ``"5m"``, ``"1h30m"``; None if it is not a duration."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        return float(text) if text else None
    except ValueError:
        pass
    match = _DURATION.match(text)
    if match is None or not any(match.groupdict().values()):
        return None
    hours, minutes, seconds = (float(match[g] or 0) for g in ("h", "m", "s"))
    return hours * 3600 + minutes * 60 + seconds


# --- variables --------------------------------------------------------------------------------------

_COMMON: Final[dict[str, cel.Type]] = {
    "me": cel.Type.STRING,
    "companions": cel.Type.List(cel.Type.STRING),
    "busy": cel.Type.BOOL,
    "idle_seconds": cel.Type.DOUBLE,
    "fired": cel.Type.INT,
}
_MESSAGE: Final[dict[str, cel.Type]] = {
    "text": cel.Type.STRING,
    "sender": cel.Type.STRING,
    "to": cel.Type.List(cel.Type.STRING),
    "addressed": cel.Type.BOOL,
    "metadata": cel.Type.Map(cel.Type.STRING, cel.Type.DYN),
}
_COMPANION: Final[dict[str, cel.Type]] = {"companion_id": cel.Type.STRING, "companion_name": cel.Type.STRING}


def _declarations(kind: RoutineKind) -> dict[str, cel.Type]:
    if kind == "message":
        return {**_COMMON, **_MESSAGE}
    if kind in ("joined", "left"):
        return {**_COMMON, **_COMPANION}
    return dict(_COMMON)


# --- compiled -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompiledRoutine:
    """A checked routine: its trigger, bounds, compiled CEL and the tool it fires."""

    name: str
    tool: str
    """The tool's id (what :meth:`ActionRuntime.call <companion.actions.ActionRuntime.call>` takes)."""
    kind: RoutineKind
    interval: float
    """``every``: the interval; ``idle``: the silence; 0 for ``on`` routines."""
    cooldown: float
    max_fires: int
    max_wait: float
    speaks: bool
    """Its tool publishes on ``messages``: it waits for a quiet conversation."""
    input: Mapping[str, Any] = field(default_factory=dict)
    guard: cel.Expression | None = field(default=None, repr=False, compare=False)
    args: Mapping[str, cel.Expression] = field(default_factory=dict, repr=False, compare=False)
    env: cel.Env | None = field(default=None, repr=False, compare=False)


def compile_routines(
    routines: Sequence[Routine], tools: Sequence[ActionDef | KnowledgeDef | None]
) -> tuple[CompiledRoutine, ...]:
    """Check and compile routines; ``tools[i]`` is routine ``i``'s resolved tool, or None.

    None means the tool reference is already reported as a problem by the caller (the card
    checker): the checks that need the tool are skipped. Raises :class:`RoutineError` listing
    every problem, each with a path inside ``routines`` and a fix.
    """
    if len(tools) != len(routines):
        raise ValueError("compile_routines needs one tool (or None) per routine")
    problems: list[TriggerProblem] = []
    compiled: list[CompiledRoutine] = []
    names: dict[str, int] = {}
    for index, (routine, defn) in enumerate(zip(routines, tools, strict=True)):
        found = _Compiling(index, routine, defn)
        result = found.compile()
        problems.extend(found.problems)
        name = routine.name or f"{defn.id if defn else routine.tool}#{index}"
        if name in names:
            problems.append(
                TriggerProblem(
                    (index, "name"),
                    f"the name {name!r} is already used by routines[{names[name]}]",
                    "give each routine its own name",
                )
            )
        names.setdefault(name, index)
        if result is not None:
            compiled.append(result)
    if problems:
        raise RoutineError(problems)
    return tuple(compiled)


class _Compiling:
    """The problems of one routine, collected while compiling it."""

    def __init__(self, index: int, routine: Routine, defn: ActionDef | KnowledgeDef | None) -> None:
        self.index = index
        self.routine = routine
        self.defn = defn
        self.problems: list[TriggerProblem] = []

    def add(self, where: Sequence[PathPart], message: str, fix: str, **kw: Any) -> None:
        self.problems.append(TriggerProblem((self.index, *where), message, fix, **kw))

    def duration(self, key: str, *, low: float, high: float) -> float | None:
        raw = getattr(self.routine, key)
        if raw is None:
            return None
        seconds = parse_duration(raw)
        if seconds is None:
            self.add([key], f"{raw!r} is not a duration", _DURATION_FIX)
            return None
        if not low <= seconds <= high:
            self.add(
                [key],
                f"{key} is {seconds:g} s; it must be between {low:g} s and {high:g} s",
                f"use a value from {low:g} s to {high:g} s",
            )
            return None
        return seconds

    def compile(self) -> CompiledRoutine | None:
        routine = self.routine
        given = [k for k in ("every", "idle", "on") if getattr(routine, k) is not None]
        if not given:
            self.add(
                [],
                "the routine has no trigger",
                "add one of `every: 10m` (a clock), `idle: 5m` (silence) or `on: joined|left|message`",
            )
        elif len(given) > 1:
            self.add(
                [given[1]],
                f"the routine has several triggers ({', '.join(given)})",
                "keep one trigger per routine; write a second routine for the other",
            )
        interval = 0.0
        kind: RoutineKind = "every"
        if routine.every is not None:
            interval = self.duration("every", low=MIN_INTERVAL, high=MAX_INTERVAL) or 0.0
        elif routine.idle is not None:
            kind = "idle"
            interval = self.duration("idle", low=MIN_INTERVAL, high=MAX_INTERVAL) or 0.0
        elif routine.on is not None:
            kind = routine.on
        cooldown = self.duration("cooldown", low=MIN_INTERVAL, high=MAX_INTERVAL)
        if cooldown is None:
            cooldown = interval if kind in ("every", "idle") and interval else DEFAULT_EVENT_COOLDOWN
        if kind == "every" and interval and cooldown < interval:
            self.add(
                ["cooldown"],
                f"the cooldown ({cooldown:g} s) is shorter than the interval ({interval:g} s)",
                "remove cooldown (an every routine waits its interval anyway) or make it longer",
            )
        max_wait = self.duration("max_wait", low=0.0, high=MAX_WAIT_LIMIT)
        declarations = _declarations(kind)
        env = cel_env(declarations)
        vocabulary = f"a routine fired {'on ' + kind if kind in ('joined', 'left', 'message') else kind}"
        guard = None
        if routine.when is not None:
            guard, found = compile_cel(
                env,
                routine.when,
                (self.index, "when"),
                list(declarations),
                vocabulary=vocabulary,
                condition=True,
            )
            self.problems.extend(found)
        args: dict[str, cel.Expression] = {}
        for key, expression in routine.args.items():
            program, found = compile_cel(
                env, expression, (self.index, "args", key), list(declarations), vocabulary=vocabulary
            )
            self.problems.extend(found)
            if program is None:
                continue
            returns = program.return_type().name()
            if any(returns.startswith(t) for t in _UNJSON_TYPES):
                self.add(
                    ["args", key],
                    f"the expression has type {returns.lower()}, which is not JSON",
                    "produce a string, number, bool, list or map (e.g. string(x) for a duration)",
                )
                continue
            args[key] = program
        self._check_input()
        if self.defn is None or self.problems:
            return None
        speaks = isinstance(self.defn, ActionDef) and self.defn.topic == "messages"
        return CompiledRoutine(
            name=routine.name or f"{self.defn.id}#{self.index}",
            tool=self.defn.id,
            kind=kind,
            interval=interval,
            cooldown=cooldown,
            max_fires=routine.max_fires,
            max_wait=DEFAULT_MAX_WAIT if max_wait is None else max_wait,
            speaks=speaks,
            input=dict(routine.input),
            guard=guard,
            args=args,
            env=env,
        )

    def _check_input(self) -> None:
        """The static input and the args' keys against the tool's input model."""
        defn, routine = self.defn, self.routine
        if defn is None:
            return
        model = defn.input_model
        accepted = {name for name in model.model_fields} | {
            f.alias for f in model.model_fields.values() if f.alias
        }
        fields = ", ".join(sorted(accepted)) or "(the tool takes no input)"
        for section, keys in (("input", routine.input), ("args", routine.args)):
            for key in keys:
                if key not in accepted:
                    self.add(
                        [section, key],
                        f"the tool {defn.id!r} has no input field {key!r}",
                        f"use one of: {fields}",
                    )
        for key in set(routine.input) & set(routine.args):
            self.add(["args", key], f"{key!r} is given under both input and args", "keep one of them")
        try:
            model.model_validate({**routine.input, **{k: None for k in routine.args}})
        except ValidationError as exc:
            missing: list[str] = []
            for error in exc.errors(include_url=False):
                loc = tuple(error["loc"])
                top = loc[0] if loc else None
                if top in routine.args:
                    continue  # computed when the routine fires, checked then by the runtime
                if error["type"] == "missing" and len(loc) == 1:
                    missing.append(str(top))
                elif top in routine.input:
                    self.add(["input", *loc], f"{error['msg']}", f"give {defn.id!r} a valid `{top}`")
            if missing:
                listed = ", ".join(repr(m) for m in missing)
                self.add(
                    [],
                    f"the tool {defn.id!r} needs the input field{'s' if len(missing) > 1 else ''} {listed}",
                    f"give {'each' if len(missing) > 1 else 'it'} under input (a value) or args "
                    + f"(a CEL expression), e.g. `args: {{{missing[0]}: ...}}`",
                )


# --- events ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageSeen:
    """A ``message.send`` on ``messages``, anyone's (this companion's own too: it ends silence)."""

    message: Message


@dataclass(frozen=True, slots=True)
class CompanionJoined:
    id: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class CompanionLeft:
    id: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class ConversationBusy:
    """A conversation started (or is running): speaking routines wait."""


@dataclass(frozen=True, slots=True)
class ConversationIdle:
    """The conversation ended: speaking routines may fire."""


@dataclass(frozen=True, slots=True)
class RoutineFinished:
    """The firing of routine ``name`` has settled (report it whatever its outcome)."""

    name: str


RoutineEvent: TypeAlias = (
    MessageSeen | CompanionJoined | CompanionLeft | ConversationBusy | ConversationIdle | RoutineFinished
)


@dataclass(frozen=True, slots=True)
class Firing:
    """What the shell must do: run ``tool`` with ``input`` (through the action runtime)."""

    routine: str
    tool: str
    input: Mapping[str, Any]
    kind: RoutineKind
    at: float
    speaks: bool


# --- the scheduler --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    since: float
    variables: dict[str, Any]
    ready_at: float = -math.inf
    """Not due before this (a ``left`` event waits out the rejoin grace)."""
    companion: str | None = None


@dataclass(slots=True)
class _State:
    routine: CompiledRoutine
    next_at: float = math.inf
    """``every``: when the next tick is due."""
    armed: bool = True
    """``idle``: may fire in the current silence (re-armed by another companion's message)."""
    fired: int = 0
    last_fired: float = -math.inf
    running: bool = False
    pending: deque[_Pending] = field(default_factory=deque)
    undo: tuple[float, _Pending | None] | None = None
    """What :meth:`RoutineScheduler.give_back` restores: the previous firing time and the event."""


class RoutineScheduler:
    """Decides which routines are due. Pure: every method takes ``now``; nothing waits or runs.

    The shell feeds events with :meth:`observe`, calls :meth:`due` when :meth:`deadline` passes
    or after an event, runs each :class:`Firing`, and reports :class:`RoutineFinished` for it.
    """

    def __init__(
        self,
        routines: Iterable[CompiledRoutine],
        *,
        me: str,
        now: float,
        companions: Iterable[str] = (),
        quiet_until: float = -math.inf,
        rejoin_grace: float = 0.0,
    ) -> None:
        """``quiet_until``: nothing fires before it, and companions that join before it are
        taken as present (a node that just started sees everyone arrive: none of them is a
        newcomer). ``rejoin_grace``: a companion that comes back within this many seconds of
        leaving neither fires ``joined`` again nor, having come back, ``left`` (a flapping
        connection is not a goodbye and a new hello)."""
        if rejoin_grace < 0:
            raise ValueError(f"rejoin_grace must be 0 or more, got {rejoin_grace!r}")
        self._me = me
        self._quiet_until = quiet_until
        self._grace = rejoin_grace
        self._left_at: dict[str, float] = {}
        self._states: dict[str, _State] = {}
        for routine in routines:
            state = _State(routine)
            if routine.kind == "every":
                state.next_at = now + routine.interval
            self._states[routine.name] = state
        self._companions: set[str] = {c for c in companions if c != me}
        self._busy = False
        self._last_message = now
        self.skipped: Counter[tuple[str, str]] = Counter()
        """``(routine, reason)`` -> how many firings were not made, and why."""

    # what happened

    def observe(self, event: RoutineEvent, now: float) -> None:
        """Take one event that happened at ``now``."""
        match event:
            case MessageSeen(message=message):
                self._last_message = now
                if message.params.from_ != self._me:
                    for state in self._states.values():
                        if state.routine.kind == "idle":
                            state.armed = True
                    self._offer("message", self._message_variables(message), now)
            case CompanionJoined(id=cid, name=name):
                if cid != self._me and cid not in self._companions:
                    self._companions.add(cid)
                    left_at = self._left_at.pop(cid, None)
                    if now < self._quiet_until:
                        return
                    if left_at is not None and now - left_at <= self._grace:
                        self._came_back(cid)
                        return
                    self._offer("joined", {"companion_id": cid, "companion_name": name}, now)
            case CompanionLeft(id=cid, name=name):
                if cid in self._companions:
                    self._companions.discard(cid)
                    self._remember_leaving(cid, now)
                    if now >= self._quiet_until:
                        variables = {"companion_id": cid, "companion_name": name}
                        self._offer("left", variables, now, ready_at=now + self._grace, companion=cid)
            case ConversationBusy():
                self._busy = True
            case ConversationIdle():
                self._busy = False
            case RoutineFinished(name=name):
                finished = self._states.get(name)
                if finished is not None:
                    finished.running = False
                    finished.undo = None

    def _message_variables(self, message: Message) -> dict[str, Any]:
        params = message.params
        return {
            "text": params.message,
            "sender": params.from_,
            "to": list(params.to),
            "addressed": self._me in params.to,
            "metadata": dict(params.metadata or {}),
        }

    def _remember_leaving(self, cid: str, now: float) -> None:
        """When ``cid`` left, for the rejoin grace; bounded (the oldest are forgotten first)."""
        for old in [c for c, at in self._left_at.items() if now - at > self._grace]:
            del self._left_at[old]
        while len(self._left_at) >= _MAX_LEFT:
            del self._left_at[next(iter(self._left_at))]
        self._left_at[cid] = now

    def _came_back(self, cid: str) -> None:
        """``cid`` rejoined within the grace: no hello, and its goodbye is withdrawn."""
        for state in self._states.values():
            if state.routine.kind == "joined":
                self._skip(state, "rejoined")
            elif state.routine.kind == "left":
                kept = deque(p for p in state.pending if p.companion != cid)
                if len(kept) != len(state.pending):
                    self._skip(state, "rejoined", len(state.pending) - len(kept))
                    state.pending = kept

    def _offer(
        self,
        kind: RoutineKind,
        variables: dict[str, Any],
        now: float,
        *,
        ready_at: float = -math.inf,
        companion: str | None = None,
    ) -> None:
        for state in self._states.values():
            routine = state.routine
            if routine.kind != kind:
                continue
            if state.fired >= routine.max_fires:
                self._skip(state, "max_fires")
            elif not self._guard(state, variables, now):
                self._skip(state, "guard")
            elif len(state.pending) >= MAX_PENDING:
                self._skip(state, "pending_full")
            else:
                state.pending.append(_Pending(now, variables, ready_at, companion))

    # what to do

    def due(self, now: float) -> list[Firing]:
        """The firings to start now, in card order; each is counted as fired."""
        out: list[Firing] = []
        if now < self._quiet_until:
            return out
        for state in self._states.values():
            firing = self._try(state, now)
            if firing is not None:
                out.append(firing)
        return out

    def _try(self, state: _State, now: float) -> Firing | None:
        routine = state.routine
        self._expire(state, now)
        if not self._trigger_met(state, now) or not self._free(state, now):
            return None
        variables: dict[str, Any] = {}
        taken: _Pending | None = None
        if routine.kind == "every":
            state.next_at = now + routine.interval
        elif routine.kind == "idle":
            state.armed = False
        else:
            taken = state.pending.popleft()
            variables = taken.variables
        if routine.kind in ("every", "idle") and not self._guard(state, variables, now):
            self._skip(state, "guard")
            return None
        arguments = self._arguments(state, variables, now)
        if arguments is None:
            return None
        state.undo = (state.last_fired, taken)
        state.fired += 1
        state.last_fired = now
        state.running = True
        log_event(logger, "routine_fired", routine=routine.name, tool=routine.tool, kind=routine.kind)
        return Firing(routine.name, routine.tool, arguments, routine.kind, now, routine.speaks)

    def give_back(self, firing: Firing, now: float) -> bool:
        """Undo a firing the shell could not start (say, the floor was taken before it spoke).

        The routine is due again as soon as its bounds allow (an ``on`` routine's event goes
        back to the front of its queue, keeping its age for ``max_wait``), and the firing does
        not count. Report :class:`ConversationBusy` too if that is why. False if ``firing`` is
        not the routine's running one.
        """
        state = self._states.get(firing.routine)
        if state is None or not state.running or state.undo is None or state.last_fired != firing.at:
            return False
        previous, taken = state.undo
        state.undo = None
        state.running = False
        state.fired -= 1
        state.last_fired = previous
        if state.routine.kind == "every":
            state.next_at = now
        elif state.routine.kind == "idle":
            state.armed = True
        elif taken is not None:
            state.pending.appendleft(taken)
        log_event(logger, "routine_given_back", routine=firing.routine)
        return True

    def _trigger_met(self, state: _State, now: float) -> bool:
        routine = state.routine
        if routine.kind == "every":
            return now >= state.next_at
        if routine.kind == "idle":
            return state.armed and now - self._last_message >= routine.interval
        return bool(state.pending) and state.pending[0].ready_at <= now

    def _free(self, state: _State, now: float) -> bool:
        """Whether the bounds let the routine fire now (leaving its trigger met if not)."""
        routine = state.routine
        if state.fired >= routine.max_fires:
            if state.pending:
                self._skip(state, "max_fires", len(state.pending))
                state.pending.clear()
            return False
        return not (
            state.running or now < state.last_fired + routine.cooldown or (routine.speaks and self._busy)
        )

    def _expire(self, state: _State, now: float) -> None:
        while (
            state.pending
            and now - max(state.pending[0].since, state.pending[0].ready_at) > state.routine.max_wait
        ):
            state.pending.popleft()
            self._skip(state, "expired")

    def deadline(self) -> float:
        """When :meth:`due` may next return something (``inf``: only after an event)."""
        at = min((self._next(state) for state in self._states.values()), default=math.inf)
        return max(at, self._quiet_until)

    def _next(self, state: _State) -> float:
        routine = state.routine
        if state.fired >= routine.max_fires or state.running or (routine.speaks and self._busy):
            return math.inf  # only an event (finished, idle) can change that
        ready = state.last_fired + routine.cooldown
        if routine.kind == "every":
            return max(state.next_at, ready)
        if routine.kind == "idle":
            return max(self._last_message + routine.interval, ready) if state.armed else math.inf
        return max(state.pending[0].since, state.pending[0].ready_at, ready) if state.pending else math.inf

    # CEL

    def _variables(self, state: _State, extra: Mapping[str, Any], now: float) -> dict[str, Any]:
        return {
            "me": self._me,
            "companions": sorted(self._companions),
            "busy": self._busy,
            "idle_seconds": float(max(0.0, now - self._last_message)),
            "fired": state.fired,
            **extra,
        }

    def _guard(self, state: _State, extra: Mapping[str, Any], now: float) -> bool:
        routine = state.routine
        if routine.guard is None or routine.env is None:
            return True
        activation = routine.env.Activation(self._variables(state, extra, now))
        matched, error = eval_bool(routine.guard, activation)
        if error is not None:
            log_event(logger, "routine_guard_error", logging.WARNING, routine=routine.name, error=error)
        return matched

    def _arguments(self, state: _State, extra: Mapping[str, Any], now: float) -> dict[str, Any] | None:
        routine = state.routine
        arguments = dict(routine.input)
        if not routine.args or routine.env is None:
            return arguments
        activation = routine.env.Activation(self._variables(state, extra, now))
        for key, program in routine.args.items():
            result = program.eval(activation)
            problem = None
            if result.type() == cel.Type.ERROR:
                problem = str(result.value())
            else:
                value = result.plain_value()
                try:
                    json.dumps(value, allow_nan=False)
                except (TypeError, ValueError):
                    problem = f"the value ({type(value).__name__}) is not JSON"
            if problem is not None:
                log_event(
                    logger,
                    "routine_args_error",
                    logging.WARNING,
                    routine=routine.name,
                    arg=key,
                    error=problem,
                )
                self._skip(state, "args_error")
                return None
            arguments[key] = value
        return arguments

    def _skip(self, state: _State, reason: str, count: int = 1) -> None:
        self.skipped[(state.routine.name, reason)] += count
        log_event(logger, "routine_skipped", logging.DEBUG, routine=state.routine.name, reason=reason)

    # inspection

    def fired(self, name: str) -> int:
        """How many times routine ``name`` has fired in this run."""
        return self._states[name].fired

    @property
    def busy(self) -> bool:
        return self._busy
