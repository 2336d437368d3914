"""A model-call budget in the intent: checked, encoded only when set, refinable."""

from __future__ import annotations

from decimal import Decimal

import pytest

from perdure.core.intent import Intent, budget_body
from perdure.llm import Budget


def test_an_intent_without_a_budget_encodes_as_before() -> None:
    assert "budget" not in Intent("a", "1").to_body()


def test_a_budget_round_trips_through_the_intent_body() -> None:
    intent = Intent("a", "1", budget=budget_body({"tokens": 10, "cost": 1.5, "lineage": True}))
    assert intent.budget == {"tokens": 10, "cost": "1.5", "lineage": True}
    assert Intent.from_body(intent.to_body()) == intent


def test_a_budget_object_or_a_mapping() -> None:
    assert budget_body(Budget(tokens=5)) == {"tokens": 5, "cost": None}
    assert budget_body(Budget(cost=Decimal("0.25"))) == {"tokens": None, "cost": "0.25"}
    assert budget_body({}) is None and budget_body(None) is None


@pytest.mark.parametrize("bad", [{"tokens": -1}, {"tokens": 1.5}, {"tokens": True},
                                 {"cost": "lots"}, {"cost": -1}, {"cost": "nan"},
                                 {"dollars": 1}, {"tokens": 1, "lineage": "yes"}, 5])
def test_a_wrong_budget_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        budget_body(bad)


def test_refining_the_budget_bumps_the_version() -> None:
    refined = Intent("a", "1").refined({"budget": {"tokens": 100}})
    assert (refined.version_no, refined.budget) == (2, {"tokens": 100, "cost": None})
    assert refined.refined({"budget": None}).budget is None
