"""The terminal client's logic without a terminal: frames and typed lines in, effects out.

:class:`ListenSession` never reads a socket, a clock or the keyboard. The shell feeds it what
arrived (a frame from the bridge, a line the person typed, a finished utterance) and carries
out the effects it returns: show a line, send a frame, speak a line. So every rule here — who
is addressed by ``@name``, how ``/next`` nominates, how a ``y`` answers the oldest approval —
is tested with plain calls. Time comes in as ``now`` (the shell's clock): the thinking
counter reads it, and :meth:`ListenSession.tick` says what changed since (the shell calls it at
:meth:`ListenSession.next_tick`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from companion.conversation.rules import META_CLOSING, META_IN_REPLY_TO, META_NEXT_SPEAKER
from companion.conversation.signals import (
    MAX_NAME,
    THINKING_SIGNAL,
    YIELD_SIGNAL,
    Waiting,
    ends_conversation,
    one_line,
    read_signal,
    yield_text,
)
from companion.protocol import (
    ACTIONS,
    APPROVAL_QUERY,
    COMPANION_ID_PREFIX,
    MESSAGES,
    QUERIES,
    SPEAK_QUERY,
    STATES,
    USER_ID_PREFIX,
    Action,
    Message,
    Metadata,
    PayloadError,
    Query,
    QueryResult,
    QueryResultBody,
    encode,
    new_id,
    parse_payload,
)

__all__ = [
    "APPROVAL_QUERY",
    "END_MARKER",
    "SPEAK_QUERY",
    "START_HINT",
    "STOP_TEXT",
    "Effect",
    "ListenSession",
    "Quit",
    "Send",
    "Show",
    "Speak",
    "stops",
]

HELP: Final = """\
Type a line to say it to every companion.
  @NAME text        say it to one companion (several @NAMEs for several); not private:
                    everyone on the network sees the line, only NAME answers
  /next NAME [text] nominate who speaks next (with text: send now; without: on your next line)
  y / n             answer the oldest approval request
  /stop             end the conversation now (every companion stops)
  /who              list the companions and their tools
  /quit             leave"""

START_HINT: Final = (
    "Type a line and press Enter to talk to every companion; @NAME text talks to one; /help for more."
)
END_MARKER: Final = "— the conversation has ended; type a line to start a new one —"
"""Shown once per conversation when it ends: after a message whose ``params.metadata.closing``
is ``terminal``, or a states array that chooses nobody because its stage is ``terminal`` (a
``companion.yield`` with reason ``terminal`` is one companion's limit, not the end)."""
STOP_TEXT: Final = "Let's stop here."
"""What a ``/stop`` says: the message carries ``closing: terminal`` (the person closes the
conversation; companions end it at once), and aikyo's companions read the words."""
INTERNAL_PREFIX: Final = "companion."
"""Actions named ``companion.*`` are the network's own (signals, tool lists): never shown as lines."""
TOOLS_ACTION: Final = "companion.tools"
MAX_SHOWN_IDS: Final = 4096
"""Message ids shown (history and live may both bring one; a reconnection brings the history again)."""
NOT_PRIVATE: Final = (
    "(@NAME chooses who answers; it is not private: every companion and client on the network sees the line)"
)
"""Shown the first time the person addresses someone with ``@NAME``: messages travel on one
public gossip topic, and ``to`` only says who should answer."""
MAX_YIELDS_SEEN: Final = 256
QUIET_ERRORS: Final = frozenset({"already_answered"})
"""Error frames that are no news to the person: another client answered a speak query first."""
MAX_ANSWERED: Final = 256

ShowKind: TypeAlias = Literal["message", "action", "query", "info", "error", "prompt", "status"]


@dataclass(frozen=True, slots=True)
class Show:
    """Print a line for the person. Kind ``status``: the status line now reads ``text`` (``""``:
    no status), replacing the one before (e.g. ``Juniper is thinking… (12 s)``, once a second).
    ``at``: when a message was said (seconds since the epoch; ``None``: now)."""

    text: str
    kind: ShowKind = "info"
    at: float | None = None


@dataclass(frozen=True, slots=True)
class Send:
    """Send a Firehose frame (``{"topic", "body"}`` JSON) to the bridge."""

    frame: str


@dataclass(frozen=True, slots=True)
class Speak:
    """Voice ``text``; when it has finished, call :meth:`ListenSession.speak_done` with ``query_id``."""

    query_id: str
    text: str
    emotion: str | None


@dataclass(frozen=True, slots=True)
class Quit:
    """The person asked to leave."""


Effect: TypeAlias = Show | Send | Speak | Quit


def frame_for(topic: str, envelope: Message | QueryResult) -> str:
    """A Firehose client frame publishing ``envelope`` on ``topic``."""
    return '{"topic":' + json.dumps(topic) + ',"body":' + encode(envelope).decode("utf-8") + "}"


@dataclass
class _Approval:
    query_id: str
    sender: str
    preview: str
    asked_at: float


@dataclass
class ListenSession:
    """One person's view of the conversation."""

    user_id: str
    answer_speak: bool = True
    """Answer ``speak`` queries (off when another client, e.g. a speaker, does it)."""
    voice: bool = False
    """Voice the lines of ``speak`` queries before answering (else answer when shown)."""
    approval_ttl: float = 130.0
    """Forget an approval prompt after this long (the companion stopped waiting by then)."""
    new_id: Callable[[], str] = new_id
    companions: dict[str, Metadata] = field(default_factory=dict)
    seen_companions: dict[str, None] = field(default_factory=dict)
    nominated: str | None = None
    _approvals: list[_Approval] = field(default_factory=list)
    _answered: dict[str, str] = field(default_factory=dict)
    """Approvals this person answered (query id -> preview), to explain a late refusal."""
    waiting: Waiting = field(default_factory=Waiting)
    """Companions preparing a reply (``companion.thinking``), shown on the status line."""
    _status: str = ""
    _ended: bool = False
    _told_not_private: bool = False
    """The end marker was shown for the current conversation (a new one resets it)."""
    _yields_seen: dict[tuple[str, str], None] = field(default_factory=dict)
    _shown: dict[str, None] = field(default_factory=dict)
    tools: dict[str, list[str]] = field(default_factory=dict)
    """Each companion's tools, from its ``companion.tools`` announcements (for ``/who``)."""
    dropped_signals: int = 0
    """Thinking or yield actions without what a signal must carry (not shown)."""

    def __post_init__(self) -> None:
        if not self.user_id.startswith(USER_ID_PREFIX) or len(self.user_id) == len(USER_ID_PREFIX):
            raise ValueError(f"a person's id starts with 'user_' (got {self.user_id!r}), e.g. user_yamada")

    # --- who is who --------------------------------------------------------------------

    def set_companions(self, companions: Iterable[Metadata]) -> None:
        """The bridge's directory of connected companions."""
        self.companions = {m.id: m for m in companions}

    def known_ids(self) -> list[str]:
        """Everyone a message "to all" goes to: the directory, plus companions seen speaking."""
        return list(dict.fromkeys([*self.companions, *self.seen_companions]))

    def name(self, participant: str) -> str:
        if participant == self.user_id:
            return "you"
        meta = self.companions.get(participant)
        if meta is not None:
            return meta.name
        for prefix in (COMPANION_ID_PREFIX, USER_ID_PREFIX):
            if participant.startswith(prefix):
                return participant[len(prefix) :]
        return participant

    def resolve(self, name: str) -> str | None:
        """A companion id from an id, an id without ``companion_``, or a display name."""
        wanted = name.strip().lstrip("@").casefold()
        if not wanted:
            return None
        for cid in self.known_ids():
            meta = self.companions.get(cid)
            candidates = {cid.casefold(), cid.removeprefix(COMPANION_ID_PREFIX).casefold()}
            if meta is not None:
                candidates.add(meta.name.casefold())
            if wanted in candidates:
                return cid
        if wanted.startswith(COMPANION_ID_PREFIX):
            return name.strip().lstrip("@")
        return None

    # --- from the bridge ---------------------------------------------------------------

    def on_frame(self, data: str | bytes, now: float = 0.0) -> list[Effect]:
        """A frame from the bridge: a payload on some topic, or an error frame."""
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return [Show("bridge sent something that is not JSON", "error")]
        if isinstance(obj, dict) and "error" in obj and "jsonrpc" not in obj:
            return self._on_error(obj["error"])
        payload = _parse_any(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"), obj)
        effects = self._expire(now)
        if isinstance(payload, Message):
            effects += self._on_message(payload)
        elif isinstance(payload, Query):
            effects += self._on_query(payload, now)
        elif isinstance(payload, QueryResult):
            effects += self._on_result(payload)
        elif isinstance(payload, Action):
            effects += self._on_action(payload, now)
        elif isinstance(payload, list) and ends_conversation(payload):
            effects += self._end()
        return self._status_update(now) + effects

    # --- waiting and the end -----------------------------------------------------------

    def tick(self, now: float) -> list[Effect]:
        """What changed with time alone: the thinking counters, and speakers past the deadline."""
        effects: list[Effect] = [
            Show(f"(no word from {self._short_name(s)} after {self.waiting.deadline:g} s of thinking)")
            for s in self.waiting.expire(now)
        ]
        return self._status_update(now) + effects

    def next_tick(self, now: float) -> float | None:
        """When :meth:`tick` next has something to say (``None``: nobody is thinking)."""
        return self.waiting.next_change(now)

    @property
    def status(self) -> str:
        """The status line as last shown."""
        return self._status

    def _status_update(self, now: float) -> list[Effect]:
        text = self.waiting.status(now, self.name)
        if text == self._status:
            return []
        self._status = text
        return [Show(text, "status")]

    def _end(self) -> list[Effect]:
        """The conversation is over: nobody is thinking any more; the marker, once."""
        self.waiting.clear()
        if self._ended:
            return []
        self._ended = True
        return [Show(END_MARKER)]

    def _short_name(self, participant: str) -> str:
        return one_line(self.name(participant), MAX_NAME)

    def _on_error(self, error: Any) -> list[Effect]:
        code = error.get("code") if isinstance(error, dict) else None
        if code in QUIET_ERRORS:
            ref = error.get("ref")
            preview = self._answered.get(ref) if isinstance(ref, str) else None
            if preview is None:
                return []  # a speak query another client answered first
            return [Show(f"(your answer to {preview!r} came too late: it was already answered elsewhere)")]
        return [Show(f"bridge: {_error_text(error)}", "error")]

    def on_history(self, items: Iterable[tuple[float | None, Message]]) -> list[Effect]:
        """The bridge's recent conversation (``/history``), oldest first: the lines not shown yet,
        each with its time; it moves no status (who is thinking is live news only)."""
        effects: list[Effect] = []
        for at, message in items:
            shown = self._on_message(message, at)
            effects += shown
            # the states arrays are not in the history: a reply stamped ``closing`` was the last
            # one (the stage after it is terminal), so the conversation ended there
            closing = (message.params.metadata or {}).get(META_CLOSING)
            if shown and closing == "closing" and message.params.from_.startswith(COMPANION_ID_PREFIX):
                effects += self._end()
        return effects

    def _on_message(self, message: Message, at: float | None = None) -> list[Effect]:
        params = message.params
        if params.id in self._shown:
            return []  # from the history and live, or again after a reconnection
        self._shown[params.id] = None
        while len(self._shown) > MAX_SHOWN_IDS:
            self._shown.pop(next(iter(self._shown)))
        metadata = params.metadata or {}
        if params.from_.startswith(COMPANION_ID_PREFIX):
            self.seen_companions.setdefault(params.from_)
            self.waiting.stop(params.from_)  # its reply (or any word from it) ends its thinking
            if not isinstance(metadata.get(META_IN_REPLY_TO), str):
                self._ended = False  # a companion opens a new conversation
        else:
            self._ended = False  # a person's message starts a new conversation
        if stops(message):
            who = "you" if params.from_ == self.user_id else self._short_name(params.from_)
            return [Show(f"{who} stopped the conversation", at=at), *self._end()]
        to = ", ".join(self.name(t) for t in params.to) or "nobody"
        emotion = metadata.get("emotion")
        mood = f" ({emotion})" if isinstance(emotion, str) and emotion else ""
        line = f"{self.name(params.from_)} → {to}{mood}: {params.message}"
        effects: list[Effect] = [Show(line, "message", at)]
        # a reply to people alone opens no turn: over, unless another companion is still at work
        if metadata.get(META_CLOSING) == "terminal" or (_answers_only_people(message) and not self.waiting):
            effects += self._end()
        return effects

    def _on_query(self, query: Query, now: float) -> list[Effect]:
        body = query.params.body or {}
        who = self.name(query.params.from_)
        if query.params.type == SPEAK_QUERY:
            if not self.answer_speak:
                return []
            text = body.get("message")
            if not isinstance(text, str):
                return [Send(frame_for(QUERIES, _error_result(query.id, "speak query without a message")))]
            emotion = body.get("emotion") if isinstance(body.get("emotion"), str) else None
            if self.voice:
                return [Show(f"♪ {who}: {text}", "query"), Speak(query.id, text, emotion)]
            return [
                Show(f"♪ {who}: {text}", "query"),
                Send(frame_for(QUERIES, _ok_result(query.id, {"spoken": False, "shown": True}))),
            ]
        if query.params.type == APPROVAL_QUERY:
            preview = body.get("preview") or body.get("action") or "an action"
            self._approvals.append(_Approval(query.id, query.params.from_, str(preview), now))
            return [Show(f"? {who} asks to run: {preview}  — approve? [y/n]", "prompt")]
        return []

    def _on_result(self, result: QueryResult) -> list[Effect]:
        for approval in list(self._approvals):
            if approval.query_id == result.id:
                self._approvals.remove(approval)
                return [Show(f"(the request from {self.name(approval.sender)} was answered elsewhere)")]
        return []

    def _on_signal(self, action: Action, now: float) -> list[Effect]:
        params = action.params
        signal = read_signal(params.from_, params.name, params.params)
        if signal is None:
            self.dropped_signals += 1
            return []
        if signal.name == THINKING_SIGNAL:
            self.waiting.start(signal.speaker, signal.in_reply_to, now)
            return []
        self.waiting.stop(signal.speaker, signal.in_reply_to)
        key = (signal.speaker, signal.in_reply_to)
        if key in self._yields_seen:
            return []  # the same yield again (another path, a replay)
        self._yields_seen[key] = None
        while len(self._yields_seen) > MAX_YIELDS_SEEN:
            self._yields_seen.pop(next(iter(self._yields_seen)))
        name = self._short_name(signal.speaker)
        if signal.reason == "terminal":  # its own limit only: the others may go on (cards differ)
            return [Show(yield_text(name, signal.reason, None))]
        return [Show(yield_text(name, signal.reason, signal.detail), "error")]

    def _on_action(self, action: Action, now: float) -> list[Effect]:
        params = action.params
        if params.name in (THINKING_SIGNAL, YIELD_SIGNAL):
            return self._on_signal(action, now)
        if params.name == TOOLS_ACTION:
            self._note_tools(action)
        if params.name.startswith(INTERNAL_PREFIX):
            return []  # the network's own: conversation, not protocol
        who = self.name(params.from_)
        if params.name == "progress":
            percent = params.params.get("percent")
            message = params.params.get("message") or ""
            return [
                Show(
                    f"* {who}: {params.params.get('action', 'working')} {percent}% {message}".rstrip(),
                    "action",
                )
            ]
        shown = [f"{one_line(k, 30)}: {_plain(v)}" for k, v in list(params.params.items())[:6]]
        args = f" ({', '.join(shown)})" if shown else ""
        return [Show(f"* {who}: {one_line(params.name, 60)}{args}", "action")]

    def _note_tools(self, action: Action) -> None:
        tools = action.params.params.get("tools")
        if not action.params.from_.startswith(COMPANION_ID_PREFIX) or not isinstance(tools, list):
            return
        ids = [
            one_line(t["id"], 80) for t in tools[:64] if isinstance(t, dict) and isinstance(t.get("id"), str)
        ]
        self.tools[action.params.from_] = ids
        while len(self.tools) > MAX_YIELDS_SEEN:
            self.tools.pop(next(iter(self.tools)))

    def _expire(self, now: float) -> list[Effect]:
        effects: list[Effect] = []
        for approval in list(self._approvals):
            if now - approval.asked_at > self.approval_ttl:
                self._approvals.remove(approval)
                effects.append(Show(f"(the request from {self.name(approval.sender)} expired)"))
        return effects

    # --- from the person ---------------------------------------------------------------

    def on_input(self, line: str, now: float = 0.0) -> list[Effect]:
        text = line.strip()
        effects = self._expire(now)
        if not text:
            return effects
        if self._approvals and text.casefold() in ("y", "yes", "n", "no"):
            return effects + self._answer_approval(text.casefold().startswith("y"))
        if text.startswith("/"):
            return effects + self._command(text)
        targets: list[str] = []
        words = text.split()
        while words and words[0].startswith("@") and len(words[0]) > 1:
            cid = self.resolve(words[0])
            if cid is None:
                return [*effects, Show(f"no companion called {words[0][1:]!r}; {self._who_hint()}", "error")]
            targets.append(cid)
            words.pop(0)
        body = " ".join(words) if targets else text
        if not body:
            return [*effects, Show("nothing to say", "error")]
        said = self._say(body, targets or None)
        if targets and not self._told_not_private and any(isinstance(e, Send) for e in said):
            self._told_not_private = True
            said.append(Show(NOT_PRIVATE))
        return effects + said

    def _command(self, text: str) -> list[Effect]:
        command, _, rest = text.partition(" ")
        command = command.casefold()
        if command in ("/quit", "/exit"):
            return [Quit()]
        if command == "/help":
            return [Show(HELP)]
        if command == "/who":
            if not self.known_ids():
                return [Show("no companions known yet")]
            return [Show(f"{self.name(c)} ({c}){self._tools_of(c)}") for c in self.known_ids()]
        if command == "/stop":
            return self._stop()
        if command == "/next":
            name, _, body = rest.strip().partition(" ")
            cid = self.resolve(name)
            if cid is None:
                return [Show(f"/next NAME: no companion called {name!r}; {self._who_hint()}", "error")]
            if body.strip():
                return self._say(body.strip(), None, nominate=cid)
            self.nominated = cid
            return [Show(f"your next line nominates {self.name(cid)} to speak next")]
        return [Show(f"unknown command {command}; /help lists them", "error")]

    def _say(self, text: str, targets: list[str] | None, nominate: str | None = None) -> list[Effect]:
        to = targets if targets is not None else self.known_ids()
        if not to:
            return [Show("no companions known yet: wait for one to join, or use @companion_ID", "error")]
        nominee = nominate or self.nominated
        metadata: dict[str, Any] | None = None
        if nominee is not None:
            metadata = {META_NEXT_SPEAKER: nominee}
            if nominee not in to:
                to = [*to, nominee]
        self.nominated = None
        self._ended = False  # this line starts a new conversation
        message = Message.create(self.user_id, to, text, metadata, id=self.new_id())
        return [Send(frame_for(MESSAGES, message))]

    def _tools_of(self, companion: str) -> str:
        tools = self.tools.get(companion)
        return f": {', '.join(tools)}" if tools else ""

    def _stop(self) -> list[Effect]:
        """The person ends the conversation: ``closing: terminal`` to every companion known."""
        to = self.known_ids()
        if not to:
            return [Show("no conversation to stop: no companions known yet", "error")]
        message = Message.create(self.user_id, to, STOP_TEXT, {META_CLOSING: "terminal"}, id=self.new_id())
        self.nominated = None
        self._ended = False
        return [Send(frame_for(MESSAGES, message)), *self._on_message(message)]

    def _answer_approval(self, approved: bool) -> list[Effect]:
        approval = self._approvals.pop(0)
        self._answered[approval.query_id] = approval.preview
        while len(self._answered) > MAX_ANSWERED:
            self._answered.pop(next(iter(self._answered)))
        body = {"approved": approved, "reason": f"{'approved' if approved else 'denied'} by {self.user_id}"}
        verdict = "approved" if approved else "denied"
        return [
            Send(frame_for(QUERIES, _ok_result(approval.query_id, body))),
            Show(f"{verdict}: {approval.preview}"),
        ]

    def _who_hint(self) -> str:
        names = [self.name(c) for c in self.known_ids()]
        return f"known: {', '.join(names)}" if names else "no companions known yet"

    @property
    def pending_approvals(self) -> int:
        return len(self._approvals)

    # --- from the voice ----------------------------------------------------------------

    def speak_done(self, query_id: str, *, error: str | None = None, engine: str = "") -> list[Effect]:
        """The line of ``query_id`` finished playing (or failed): report it to the companion."""
        if error is not None:
            return [
                Show(f"(voice failed: {error})", "error"),
                Send(frame_for(QUERIES, _failed_result(query_id, error))),
            ]
        body: dict[str, Any] = {"spoken": True}
        if engine:
            body["engine"] = engine
        return [Send(frame_for(QUERIES, _ok_result(query_id, body)))]


def stops(message: Message) -> bool:
    """A person's message with ``closing: terminal``: a stop (the page's Stop, ``/stop``)."""
    metadata = message.params.metadata or {}
    return (
        not message.params.from_.startswith(COMPANION_ID_PREFIX) and metadata.get(META_CLOSING) == "terminal"
    )


def _answers_only_people(message: Message) -> bool:
    """A companion's reply that addresses no companion: no turn follows it (only companions
    take turns), so the conversation is over until someone speaks again."""
    params = message.params
    return (
        params.from_.startswith(COMPANION_ID_PREFIX)
        and isinstance((params.metadata or {}).get(META_IN_REPLY_TO), str)
        and not any(t.startswith(COMPANION_ID_PREFIX) for t in params.to)
    )


def _plain(value: Any) -> str:
    """An action's argument on one short line (strings as they are, the rest as compact JSON)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return one_line(text, 60)


def _ok_result(query_id: str, body: Mapping[str, Any]) -> QueryResult:
    return QueryResult(id=query_id, result=QueryResultBody(success=True, body=dict(body)))


def _failed_result(query_id: str, error: str) -> QueryResult:
    return QueryResult(id=query_id, result=QueryResultBody(success=False, body={"error": error}))


def _error_result(query_id: str, error: str) -> QueryResult:
    return QueryResult(id=query_id, error=error)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or error)
    return str(error)


def _parse_any(data: bytes, obj: Any) -> object:
    """A payload from any topic: the frame does not say which topic it came from."""
    if isinstance(obj, list):
        states = parse_payload(STATES, data)  # not shown; read for the end of a conversation
        return None if isinstance(states, PayloadError) else states
    if not isinstance(obj, dict):
        return None
    method = obj.get("method")
    topic = {"message.send": MESSAGES, "action.send": ACTIONS}.get(method, QUERIES) if method else QUERIES
    parsed = parse_payload(topic, data)
    return None if isinstance(parsed, PayloadError) else parsed
