"""The rule book of turn-taking: pure functions over wire models, one module per concept.

No sockets, no clocks: every node reaches the same decision from the same inputs, and each
decision carries a stable ``reason`` label (for counters and tests) and a ``why`` sentence (for
people reading logs or the demo transcript).

- :mod:`.thread` -- which message a conversation is at; the turn extensions in metadata
- :mod:`.leader` -- who leads a turn and who takes over (aikyo's md5 rule over known companions)
- :mod:`.states` -- the leader's states array, its turn tag, which message an array answers
- :mod:`.speaker` -- who speaks next and who stands in; whom a reply addresses
- :mod:`.closing` -- closing stages, repetition, the turn limit

What a node *does* with these rules, event by event, is :mod:`companion.conversation.machine`.
"""

from companion.conversation.rules.closing import (
    DEFAULT_REPETITION_THRESHOLD,
    REPETITION_WINDOW,
    ClosingDecision,
    ClosingReason,
    advance,
    bigram_jaccard,
    closing_floor,
    closing_stage,
    farewell_counts,
    later,
    leading_floor,
    repetition_score,
)
from companion.conversation.rules.leader import (
    MAX_CANDIDATES,
    Candidates,
    LeaderPlan,
    leader_candidates,
    leader_slot,
    plan_leaders,
    select_leader,
)
from companion.conversation.rules.speaker import (
    FAIR_LAG,
    Preference,
    SpeakerDecision,
    SpeakerReason,
    SpeakingOrder,
    decide_next_speaker,
    ends_conversation,
    named_companion,
    owed_companion,
    preferred_speaker,
    reply_recipients,
    slot_can_be_filled,
    speaking_order,
)
from companion.conversation.rules.states import (
    EarlyStates,
    StateDecision,
    StatesOutcome,
    closing_states,
    fallback_decisions,
    finalize_states,
    held_back,
    quiet_closing,
    states_match,
    states_tag,
    turn_tag,
)
from companion.conversation.rules.thread import (
    META_CLOSING,
    META_IN_REPLY_TO,
    META_NEXT_SPEAKER,
    META_TURN,
    ConversationThread,
    Placement,
    TurnInfo,
    stamp_opening,
    stamp_reply,
    turn_info,
)

__all__ = [
    "DEFAULT_REPETITION_THRESHOLD",
    "FAIR_LAG",
    "MAX_CANDIDATES",
    "META_CLOSING",
    "META_IN_REPLY_TO",
    "META_NEXT_SPEAKER",
    "META_TURN",
    "REPETITION_WINDOW",
    "Candidates",
    "ClosingDecision",
    "ClosingReason",
    "ConversationThread",
    "EarlyStates",
    "LeaderPlan",
    "Placement",
    "Preference",
    "SpeakerDecision",
    "SpeakerReason",
    "SpeakingOrder",
    "StateDecision",
    "StatesOutcome",
    "TurnInfo",
    "advance",
    "bigram_jaccard",
    "closing_floor",
    "closing_stage",
    "closing_states",
    "decide_next_speaker",
    "ends_conversation",
    "fallback_decisions",
    "farewell_counts",
    "finalize_states",
    "held_back",
    "later",
    "leader_candidates",
    "leader_slot",
    "leading_floor",
    "named_companion",
    "owed_companion",
    "plan_leaders",
    "preferred_speaker",
    "quiet_closing",
    "repetition_score",
    "reply_recipients",
    "select_leader",
    "slot_can_be_filled",
    "speaking_order",
    "stamp_opening",
    "stamp_reply",
    "states_match",
    "states_tag",
    "turn_info",
    "turn_tag",
]
