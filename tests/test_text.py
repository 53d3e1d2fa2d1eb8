"""``companion.text.clip``: the one rule for text cut to fit on one line."""

from __future__ import annotations

from companion.text import clip


def test_clip_folds_white_space_and_ends_a_cut_with_an_ellipsis() -> None:
    assert clip(" a \n\tb  c ", 10) == "a b c"
    assert clip("abcd", 4) == "abcd"  # exactly the limit: not cut
    assert clip("abcdef", 4) == "abc…"  # cut: the ellipsis counts toward the limit
