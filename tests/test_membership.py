"""The companion directory: pins (trust on first use), join/leave events, who may send as whom,
and who may answer this node's queries."""

from __future__ import annotations

from pathlib import Path

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from companion.node.membership import BindRefused, Membership, MembershipEvent
from companion.node.trust import TrustStore
from companion.protocol import APPROVAL_QUERY, Metadata
from support.cards import metadata as md

ME = "peer-me"


def real_peer() -> str:
    """A peer id the trust file accepts (the file refuses anything else)."""
    return ID.from_pubkey(create_new_key_pair().public_key).to_base58()


@pytest.fixture
def members() -> Membership:
    return Membership(ME, md("me"))


def join(m: Membership, peer: str, metadata: Metadata) -> list[MembershipEvent]:
    m.peer_connected(peer)
    result = m.bind(peer, metadata)
    assert isinstance(result, list), result
    return result


def test_directory_starts_with_ourselves_and_is_read_only(members: Membership) -> None:
    assert dict(members.directory) == {"companion_me": md("me")}
    with pytest.raises(TypeError):
        members.directory["companion_x"] = md("x")  # type: ignore[index]


def test_bridge_directory_starts_empty() -> None:
    assert len(Membership(ME, None).directory) == 0


def test_join_and_leave_are_events_and_update_the_directory(members: Membership) -> None:
    events = join(members, "peer-a", md("a"))
    assert [(e.kind, e.companion_id, e.peer_id, e.reason) for e in events] == [
        ("joined", "companion_a", "peer-a", "metadata")
    ]
    assert set(members.directory) == {"companion_me", "companion_a"}
    left = members.peer_disconnected("peer-a")
    assert [(e.kind, e.companion_id, e.reason) for e in left] == [("left", "companion_a", "disconnected")]
    assert set(members.directory) == {"companion_me"}
    assert members.peer_disconnected("peer-a") == []


def test_claim_from_a_peer_that_is_not_connected_is_refused(members: Membership) -> None:
    refused = members.bind("peer-a", md("a"))
    assert isinstance(refused, BindRefused) and refused.reason == "not_connected"
    assert members.owner_of("companion_a") is None


def test_a_pinned_id_cannot_be_taken_while_its_owner_is_connected(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    members.peer_connected("peer-evil")
    refused = members.bind("peer-evil", md("a"))
    assert refused == BindRefused("peer-evil", "companion_a", "id_pinned", "peer-a")
    assert members.owner_of("companion_a") == "peer-a"
    assert members.companion_of("peer-evil") is None


def test_our_own_id_cannot_be_claimed(members: Membership) -> None:
    members.peer_connected("peer-evil")
    assert members.bind("peer-evil", md("me")) == BindRefused("peer-evil", "companion_me", "our_own_id", ME)


def test_non_companion_id_is_refused(members: Membership) -> None:
    members.peer_connected("peer-a")
    refused = members.bind("peer-a", md("a", id="user_a"))
    assert isinstance(refused, BindRefused) and refused.reason == "not_a_companion_id"


def test_the_hijack_after_a_crash_is_refused_and_the_owner_let_back_in(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    members.peer_disconnected("peer-a")  # the companion crashed
    assert members.owner_of("companion_a") == "peer-a"
    # another key claims the id while the owner is away: refused, and it may not speak as it
    members.peer_connected("peer-evil")
    refused = members.bind("peer-evil", md("a", name="evil"))
    assert refused == BindRefused("peer-evil", "companion_a", "id_pinned", "peer-a")
    assert "companion_a" not in members.directory
    assert members.check_sender("peer-evil", "companion_a") is not None
    # the owner comes back with its key: let in, its messages accepted
    events = join(members, "peer-a", md("a"))
    assert [(e.kind, e.reason) for e in events] == [("joined", "metadata")]
    assert members.check_sender("peer-a", "companion_a") is None
    assert members.bind("peer-evil", md("a")) == refused


def test_pins_outlive_the_membership_that_learned_them(tmp_path: Path) -> None:
    """A restarted node (a new Membership over the same data directory) still knows the owner."""
    owner, evil = real_peer(), real_peer()
    first = Membership(ME, md("me"), TrustStore.in_directory(tmp_path))
    join(first, owner, md("a"))
    again = Membership(ME, md("me"), TrustStore.in_directory(tmp_path))
    again.peer_connected(evil)
    assert again.bind(evil, md("a")) == BindRefused(evil, "companion_a", "id_pinned", owner)
    assert again.check_sender(owner, "companion_a") is None
    assert join(again, owner, md("a"))[0].kind == "joined"


def test_an_operator_pin_refuses_squatting_before_the_first_meeting() -> None:
    trust = TrustStore()
    trust.hold("companion_a", "peer-a", "flag")
    members = Membership(ME, md("me"), trust)
    members.peer_connected("peer-squat")
    refused = members.bind("peer-squat", md("a"))
    assert isinstance(refused, BindRefused) and refused.reason == "id_pinned" and refused.owner == "peer-a"
    assert members.check_sender("peer-squat", "companion_a") is not None
    assert join(members, "peer-a", md("a"))[0].kind == "joined"


def test_a_rekey_moves_the_id_and_the_old_key_leaves(tmp_path: Path) -> None:
    old, new = real_peer(), real_peer()
    members = Membership(ME, md("me"), TrustStore.in_directory(tmp_path))
    join(members, old, md("a"))
    TrustStore.in_directory(tmp_path).rekey("companion_a", new)  # ``companion trust rekey``
    events = join(members, new, md("a"))
    assert [(e.kind, e.peer_id, e.reason) for e in events] == [
        ("left", old, "rekeyed"),
        ("joined", new, "metadata"),
    ]
    assert members.check_sender(old, "companion_a") is not None
    assert members.bind(old, md("a")) == BindRefused(old, "companion_a", "id_pinned", new)


def test_pin_from_another_authenticated_source_needs_no_connection(members: Membership) -> None:
    """What presence announcements relayed by others use: :meth:`Membership.pin`."""
    assert members.pin("peer-far", "companion_far") is None
    assert members.owner_of("companion_far") == "peer-far"
    assert "companion_far" not in members.directory  # pinned, not present
    assert members.companion_of("peer-far") == "companion_far"
    assert members.pin("peer-evil", "companion_far") == BindRefused(
        "peer-evil", "companion_far", "id_pinned", "peer-far"
    )
    assert members.pin("peer-evil", "companion_me") == BindRefused(
        "peer-evil", "companion_me", "our_own_id", ME
    )
    assert members.pin("peer-x", "user_x") == BindRefused("peer-x", "user_x", "not_a_companion_id")


def test_same_peer_new_metadata_is_an_update_not_a_join(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    assert join(members, "peer-a", md("a")) == []
    events = join(members, "peer-a", md("a", name="A2"))
    assert [(e.kind, e.metadata.name) for e in events] == [("updated", "A2")]


def test_peer_claiming_another_id_moves_its_first_use_pin(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    events = join(members, "peer-a", md("b"))
    assert [(e.kind, e.companion_id, e.reason) for e in events] == [
        ("left", "companion_a", "replaced"),
        ("joined", "companion_b", "metadata"),
    ]
    assert members.owner_of("companion_a") is None  # released: the card's id changed
    assert members.owner_of("companion_b") == "peer-a"
    assert set(members.directory) == {"companion_me", "companion_b"}
    assert members.check_sender("peer-a", "companion_a") is not None


def test_nodes_of_one_process_share_their_pins_and_own_ids() -> None:
    trust = TrustStore()
    a = Membership("peer-a", md("a"), trust)
    b = Membership("peer-b", md("b"), trust)
    # b has not met a yet, but a runs in this process: nobody else can claim it at b
    b.peer_connected("peer-evil")
    assert b.bind("peer-evil", md("a")) == BindRefused("peer-evil", "companion_a", "id_pinned", "peer-a")
    join(a, "peer-c", md("c"))
    assert b.owner_of("companion_c") == "peer-c"


def test_sender_rules(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    assert members.check_sender("peer-a", "companion_a") is None
    assert members.check_sender(ME, "companion_me") is None
    # an id pinned to another peer
    assert "pinned to peer peer-a" in (members.check_sender("peer-x", "companion_a") or "")
    assert members.check_sender("peer-a", "companion_me") is not None
    # a companion peer speaks only as itself, also with client ids
    assert members.check_sender("peer-a", "companion_unknown") is not None
    assert members.check_sender("peer-a", "user_1") is not None
    # ... connected or not: a relayed message, or one sent during a reconnect
    members.peer_disconnected("peer-a")
    assert members.check_sender("peer-a", "companion_a") is None
    assert members.check_sender("peer-a", "user_1") is not None
    # an unpinned peer (a bridge) may use ids that are not pinned
    assert members.check_sender("peer-bridge", "user_1") is None
    assert members.check_sender("peer-bridge", "companion_far") is None


def test_states_sender_rules(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    join(members, "peer-b", md("b"))
    # the leader publishes states for every addressed companion, itself included
    assert members.check_states_sender("peer-a", ["companion_me", "companion_a"]) is None
    assert members.check_states_sender("peer-a", ["companion_me"]) is not None
    assert members.check_states_sender(ME, ["companion_me", "companion_a"]) is None
    # an unpinned peer may not speak for pinned companions
    assert members.check_states_sender("peer-x", ["companion_a"]) is not None
    assert members.check_states_sender("peer-x", ["companion_far"]) is None
    assert members.check_states_sender("peer-a", []) is None


def test_states_from_the_true_leader_are_accepted_when_relayed_or_reconnecting(members: Membership) -> None:
    """Gossipsub keeps the origin's signature when a peer relays: the signer is the leader even
    when it is not (or no longer) connected to us."""
    join(members, "peer-a", md("a"))
    join(members, "peer-b", md("b"))
    members.peer_disconnected("peer-a")  # a reconnects, or reaches us only through b
    assert members.check_states_sender("peer-a", ["companion_a", "companion_b", "companion_me"]) is None
    # a peer pinned to another companion may not publish an array without its own
    assert members.check_states_sender("peer-b", ["companion_a", "companion_me"]) is not None
    assert members.check_states_sender("peer-a", ["companion_b", "companion_me"]) is not None


def test_who_may_answer_this_nodes_queries() -> None:
    trust = TrustStore()
    trust.allow("peer-bridge", "approver")
    trust.allow("peer-voice", "answerer")
    members = Membership(ME, md("me"), trust)
    assert members.may_answer("peer-bridge", "speak") and members.may_answer("peer-bridge", APPROVAL_QUERY)
    assert members.may_answer("peer-voice", "speak")
    assert not members.may_answer("peer-voice", APPROVAL_QUERY)
    assert members.may_answer(ME, APPROVAL_QUERY)
    join(members, "peer-a", md("a"))
    for stranger in ("peer-a", "peer-raw"):  # neither a companion nor a raw peer answers
        assert not members.may_answer(stranger, "speak")
        assert not members.may_answer(stranger, APPROVAL_QUERY)
