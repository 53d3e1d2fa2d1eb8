"""``companion.card.paramfit``: a model's parameters fitted to the card's schema before CEL reads them
(measured with SmolLM2-135M: ``topic_energy: 32`` where the card allows 10, twice; and
``wants_to_end: true`` on the first turn)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
from hypothesis import given
from hypothesis import strategies as st

from companion.card.model import load_card
from companion.card.paramfit import fit_params, is_ending_param, plausible_early

PIM = load_card(Path(__file__).resolve().parents[1] / "cards" / "pim.yaml")
SCHEMA: dict[str, Any] = dict(PIM.card.events.params)


def test_out_of_range_numbers_are_clamped_and_reported() -> None:
    fitted = fit_params(
        {"emotion": "excited", "foods_mentioned": [], "topic_energy": 32, "wants_to_end": False}, SCHEMA
    )
    assert fitted.values["topic_energy"] == 10
    assert fitted.changes == ("topic_energy: 32 clamped to 10 (the card allows 0..10)",)
    jsonschema.validate(fitted.values, SCHEMA)
    assert fit_params({"topic_energy": -3}, SCHEMA).values["topic_energy"] == 0


def test_values_written_as_text_are_read_where_plainly_meant() -> None:
    fitted = fit_params(
        {"emotion": "Excited", "foods_mentioned": ["cake"], "topic_energy": "7", "wants_to_end": "false"},
        SCHEMA,
    )
    assert fitted.values == {
        "emotion": "excited",
        "foods_mentioned": ["cake"],
        "topic_energy": 7,
        "wants_to_end": False,
    }
    assert len(fitted.changes) == 3


def test_what_cannot_be_fitted_is_left_for_the_schema_to_refuse() -> None:
    raw = {"emotion": "furious", "foods_mentioned": "cake", "topic_energy": 2.5, "wants_to_end": "maybe"}
    fitted = fit_params(raw, SCHEMA)
    assert fitted.values == raw and fitted.changes == ()
    assert len(list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(fitted.values))) == 4


def test_bounds_lengths_and_extra_keys() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5},
            "x": {"type": "number", "maximum": 1.5},
            "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 3}},
        },
    }
    fitted = fit_params({"n": 9, "x": 2, "tags": ["abcdef", "b", "c"], "extra": 1}, schema)
    assert fitted.values == {"n": 4, "x": 1.5, "tags": ["abc", "b"]}
    jsonschema.validate(fitted.values, schema)
    assert fit_params({"n": 0}, schema).values == {"n": 1}


def test_an_early_ending_waits_for_a_goodbye() -> None:
    values = {"emotion": "excited", "foods_mentioned": [], "topic_energy": 3, "wants_to_end": True}
    opening = plausible_early(values, SCHEMA, "Hello everyone, what did you bake today?")
    assert opening.values["wants_to_end"] is False
    assert opening.changes == ("wants_to_end: true this early, and nobody took leave: set false",)
    # the CEL conditions then choose the ordinary reply, not the goodbye
    [instruction] = PIM.triggers.evaluate(opening.values)
    assert "what they would bake" in instruction.instruction
    for goodbye in ("Good night, everyone!", "Bye for now", "おやすみなさい"):
        assert plausible_early(values, SCHEMA, goodbye).values["wants_to_end"] is True


def test_which_parameters_are_about_ending() -> None:
    boolean = {"type": "boolean"}
    assert all(is_ending_param(n, boolean) for n in ("wants_to_end", "said_goodbye", "ready_to_leave"))
    assert not any(is_ending_param(n, boolean) for n in ("weather_mentioned", "already_met", "tender"))
    assert not is_ending_param("wants_to_end", {"type": "string"})


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
)


@given(st.dictionaries(st.sampled_from([*sorted(SCHEMA["properties"]), "other"]), VALUES, max_size=6))
def test_any_answer_is_fitted_without_raising(raw: dict[str, Any]) -> None:
    fitted = fit_params(raw, SCHEMA)
    assert set(fitted.values) == set(raw)
    assert isinstance(PIM.triggers.evaluate(fitted.values), list)
