"""Conversations in a mixed network end on time: two JavaScript peers that take turns as aikyo 1.6
companions do (only an array's top speaker replies, yields ignored, ``closing: none`` arrays, no
turn limit, aikyo's model calls under its one "generating" flag) and two ``companion run``
companions with turn limits 3 and 4, opened by a client twenty times back to back.

Before, near the end of a conversation, aikyo's array picked a companion past its limit, which
gave its slot up, and the next slots were aikyo's, which never take one: the conversation fell
silent for a reply deadline per slot; aikyo speakers also talked on past the limits. Now what our
nodes do is counted apart from what the aikyo peers do, and ours is held to zero: no stall, no
second array of ours for a message except the closing array of a turn nobody could follow, no
reply of ours past its own limit, and no reply past the highest limit that ours said or that an
array of ours chose; each aikyo reply past it is answered first by our ``terminal`` array. What
aikyo's own leaders add (their array after our ``terminal``, an aikyo speaker their array picks
past the limit) is printed, with who published what (docs/network.md says why it cannot be
prevented from our side).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.js import js_peer_command
from support.mixed import mixed_network, stories, summary

# Mostly waits (aikyo's 200 ms per model call, 2 s of quiet after each end): it held its figures
# beside lint and types and on a machine at a load of 13, so it runs in the early phase.
pytestmark = [pytest.mark.integration, pytest.mark.early]

CONVERSATIONS = 20


@pytest.mark.timeout(400)
def test_mixed_conversations_end_within_the_caps_without_stalls(tmp_path: Path) -> None:
    js_peer = js_peer_command()
    if js_peer is None:
        pytest.skip("Node.js and npm are not installed: the JavaScript aikyo peers cannot run")
    with mixed_network(tmp_path, js_peer) as mixed:
        reports = [mixed.converse(quiet=2.0, stall=20.0, limit=60.0) for _ in range(CONVERSATIONS)]
        figures = summary(reports)
        print("mixed network:", json.dumps(figures))
        print("\n".join(stories(reports)))
        assert figures["stalls"] == 0, figures
        assert all(r.terminal_after is not None for r in reports), figures
        # ours: one array per addressed message, a second only to close a turn nobody could follow
        assert figures["second_arrays"]["ours_extra"] == 0, figures
        assert set(figures["arrays_per_addressed_message"]) <= {1, 2}, figures
        # ours: nobody of ours speaks past its limit, and no array of ours chooses a speaker past
        # the highest one; an aikyo reply past it (an aikyo leader's choice) gets our terminal first
        assert figures["our_replies_past_own_cap"] == 0, figures
        past = figures["replies_past_highest_cap"]
        assert past["ours"] == 0 and past["unexplained"] == 0, figures
        assert figures["of_them_answered_by_our_terminal"] == past["aikyo"], figures
        for proc in mixed.js:
            assert proc.count("error") == 0, proc.tail()
