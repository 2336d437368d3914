"""Words the displays print: every decision said in English, exact amounts never in
exponent form, a cut value marked with an ellipsis."""

from __future__ import annotations

from decimal import Decimal

import pytest

from perdure.core.bodies.tools import DECIDED, DECISIONS
from perdure.core.usage import UsageTotals, decimal_text
from perdure.describe import clip


@pytest.mark.parametrize("decision", DECISIONS)
def test_every_decision_has_its_word(decision: str) -> None:
    """Each decision a ``tool_decided`` record can hold is said as a participle."""
    assert DECIDED[decision].endswith("ed") and not DECIDED[decision].endswith("dd")
    assert DECIDED["reject"] == "rejected" and DECIDED["edit"] == "edited"


@pytest.mark.parametrize(("value", "text"), [
    (Decimal(0).scaleb(-8), "0"), (Decimal(1).scaleb(-7), "0.0000001"),
    (Decimal("0.002500"), "0.002500"), (Decimal("12"), "12")])
def test_amounts_are_written_positionally(value: Decimal, text: str) -> None:
    """``0E-8`` is written ``0``; no amount is written in exponent form."""
    assert decimal_text(value) == text
    assert UsageTotals(cost=value).to_json()["cost"] == text


def test_a_cut_is_marked() -> None:
    """A value longer than its room ends in an ellipsis; a short one is left alone."""
    assert clip("x" * 10, 5) == "xxxx…" and clip("abc", 5) == "abc"
