"""The companion directory: binding rules, join/leave events, who may send as whom."""

from __future__ import annotations

import pytest

from companion.membership import BindRefused, Membership, MembershipEvent
from companion.protocol import Metadata


def md(key: str, **changes: str) -> Metadata:
    fields = {"id": f"companion_{key}", "name": key, "personality": "p", "story": "s", "sample": "x"}
    fields.update(changes)
    return Metadata(**fields)


ME = "peer-me"


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


def test_id_held_by_a_connected_peer_cannot_be_taken(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    members.peer_connected("peer-evil")
    refused = members.bind("peer-evil", md("a"))
    assert refused == BindRefused("peer-evil", "companion_a", "id_taken", "peer-a")
    assert members.owner_of("companion_a") == "peer-a"


def test_our_own_id_cannot_be_claimed(members: Membership) -> None:
    members.peer_connected("peer-evil")
    refused = members.bind("peer-evil", md("me"))
    assert isinstance(refused, BindRefused) and refused.reason == "our_own_id"


def test_non_companion_id_is_refused(members: Membership) -> None:
    members.peer_connected("peer-a")
    refused = members.bind("peer-a", md("a", id="user_a"))
    assert isinstance(refused, BindRefused) and refused.reason == "not_a_companion_id"


def test_binding_outlives_the_connection_until_another_peer_proves_the_id(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    members.peer_disconnected("peer-a")
    assert members.owner_of("companion_a") == "peer-a"
    assert members.check_sender("peer-new", "companion_a") is not None
    events = join(members, "peer-new", md("a"))
    assert [(e.kind, e.reason) for e in events] == [("joined", "rebound")]
    assert members.owner_of("companion_a") == "peer-new"
    assert members.check_sender("peer-a", "companion_a") is not None


def test_same_peer_new_metadata_is_an_update_not_a_join(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    assert join(members, "peer-a", md("a")) == []
    events = join(members, "peer-a", md("a", name="A2"))
    assert [(e.kind, e.metadata.name) for e in events] == [("updated", "A2")]


def test_peer_claiming_another_id_replaces_its_old_one(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    events = join(members, "peer-a", md("b"))
    assert [(e.kind, e.companion_id, e.reason) for e in events] == [
        ("left", "companion_a", "replaced"),
        ("joined", "companion_b", "metadata"),
    ]
    assert members.owner_of("companion_a") is None
    assert set(members.directory) == {"companion_me", "companion_b"}


def test_sender_rules(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    assert members.check_sender("peer-a", "companion_a") is None
    assert members.check_sender(ME, "companion_me") is None
    # an id bound to another peer
    assert "bound to peer peer-a" in (members.check_sender("peer-x", "companion_a") or "")
    assert members.check_sender("peer-a", "companion_me") is not None
    # a companion peer speaks only as itself, also with client ids
    assert members.check_sender("peer-a", "companion_unknown") is not None
    assert members.check_sender("peer-a", "user_1") is not None
    # an unbound peer (a bridge, or a companion relayed through others) may use unbound ids
    assert members.check_sender("peer-bridge", "user_1") is None
    assert members.check_sender("peer-bridge", "companion_far") is None


def test_states_sender_rules(members: Membership) -> None:
    join(members, "peer-a", md("a"))
    # the leader publishes states for every addressed companion, itself included
    assert members.check_states_sender("peer-a", ["companion_me", "companion_a"]) is None
    assert members.check_states_sender("peer-a", ["companion_me"]) is not None
    assert members.check_states_sender(ME, ["companion_me", "companion_a"]) is None
    # an unbound peer may not speak for bound companions
    assert members.check_states_sender("peer-x", ["companion_a"]) is not None
    assert members.check_states_sender("peer-x", ["companion_far"]) is None
    assert members.check_states_sender("peer-a", []) is None
