"""Conversations in a mixed network end on time: two JavaScript peers that take turns as aikyo 1.6
companions do (only an array's top speaker replies, yields ignored, ``closing: none`` arrays, no
turn limit) and two ``companion run`` companions with turn limits 3 and 4, opened by a client
twenty times back to back.

Before, near the end of a conversation, aikyo's array picked a companion past its limit, which
gave its slot up, and the next slots were aikyo's, which never take one: the conversation fell
silent for a reply deadline per slot; aikyo speakers also talked on past the limits. Now: no
stall, every addressed message gets one states array (a second only to close a turn nobody could
follow, or aikyo's leader's after our terminal), none of ours speaks past its limit, and an aikyo
reply past the highest limit gets our terminal array at once. The counts are printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.js import js_peer_command
from support.mixed import mixed_network, summary

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
        assert figures["stalls"] == 0, figures
        assert all(r.terminal_after is not None for r in reports), figures
        # every addressed message answered by one array; a second only closes a turn nobody could
        # follow, or is aikyo's leader's after our terminal answered an aikyo reply past a limit
        assert set(figures["arrays_per_addressed_message"]) <= {1, 2}, figures
        assert figures["second_arrays"]["extra"] == 0, figures
        # None of ours speaks past its limit, and a reply past the highest limit is an aikyo
        # companion's (chosen by an aikyo leader, which knows no limit), answered by our
        # terminal array at once. (aikyo follows every array it receives: when its leader's
        # array for such a reply picks an aikyo speaker again, that one speaks whatever we
        # publish; the count is printed, docs/network.md says so.)
        assert figures["our_replies_past_own_cap"] == 0, figures
        past = figures["replies_past_highest_cap"]
        assert figures["of_them_aikyo_answered_by_our_terminal"] == past, figures
        for proc in mixed.js:
            assert proc.count("error") == 0, proc.tail()
