"""Prices and cost: exact decimals, user-set, unknown stays unknown."""

from __future__ import annotations

from decimal import Decimal

import pytest

from perdure.errors import ConfigurationError
from perdure.llm import Price, PriceTable, Usage, cost_of, micro_dollars

TABLE = PriceTable({
    "gpt-4o": Price("2.50", "10.00", cached_input="1.25"),
    "claude-x": Price("3", "15", cached_input="0.30", cache_write_input="3.75"),
    "cheap": Price(Decimal("0.15"), 0.6),
})


def test_cost_is_exact() -> None:
    """Cost is tokens times price per million, exact to the last digit."""
    assert TABLE.cost("gpt-4o", Usage(1_000_000, 1_000_000)) == Decimal("12.5")
    assert TABLE.cost("cheap", Usage(1, 1)) == Decimal("0.00000075")
    assert TABLE.cost("gpt-4o", Usage(1000, 200, cached_input_tokens=400)) == (
        Decimal(600) * Decimal("2.50") + 400 * Decimal("1.25") + 200 * Decimal(10)
    ) / 1_000_000


def test_no_float_drift_over_many_calls() -> None:
    """A million one-token calls add up to exactly a million times one call."""
    one = TABLE.cost("cheap", Usage(1, 0))
    assert one is not None
    total = sum((one for _ in range(1_000_000)), Decimal(0))
    assert total == Decimal("0.15")
    assert 0.1 + 0.2 != 0.3 and Decimal("0.1") + Decimal("0.2") == Decimal("0.3")


def test_anthropic_cache_tokens() -> None:
    """Cache reads and writes are priced apart from the plain input tokens."""
    usage = Usage(input_tokens=1500, output_tokens=100, cached_input_tokens=1000,
                  cache_write_input_tokens=400)
    expected = (100 * Decimal(3) + 1000 * Decimal("0.30") + 400 * Decimal("3.75")
                + 100 * Decimal(15)) / 1_000_000
    assert TABLE.cost("claude-x", usage) == expected


def test_unknown_is_none_never_a_guess() -> None:
    """An unknown model, or tokens of a kind the price lacks, give ``None``."""
    assert TABLE.cost("gpt-4o-2024-08-06", Usage(10, 10)) is None
    assert TABLE.cost("cheap", Usage(10, 10, cached_input_tokens=5)) is None
    assert TABLE.cost("gpt-4o", Usage(10, 10, cache_write_input_tokens=5)) is None
    assert cost_of(Usage(), Price(1, 1)) == 0


def test_table_is_set_by_the_user_and_immutable() -> None:
    """``with_price`` and ``alias`` return new tables; JSON round-trips."""
    dated = TABLE.alias("gpt-4o-2024-08-06", "gpt-4o")
    assert "gpt-4o-2024-08-06" in dated and "gpt-4o-2024-08-06" not in TABLE
    assert dated.cost("gpt-4o-2024-08-06", Usage(10, 10)) == TABLE.cost("gpt-4o",
                                                                        Usage(10, 10))
    assert PriceTable.from_json(TABLE.to_json()) == TABLE
    assert PriceTable().price("gpt-4o") is None  # nothing ships: prices change


@pytest.mark.parametrize("bad", ["-1", "NaN", "Infinity", "ten", True])
def test_bad_prices_are_refused(bad: object) -> None:
    """Negative, infinite, not-a-number and non-numeric prices are configuration errors."""
    with pytest.raises(ConfigurationError):
        Price(bad, "1")


def test_bad_table_input_is_refused() -> None:
    """Unknown price fields, non-Price values and aliases to nothing are refused."""
    with pytest.raises(ConfigurationError):
        PriceTable.from_json({"m": {"input": "1", "output": "1", "cache": "1"}})
    with pytest.raises(ConfigurationError):
        PriceTable({"m": {"input": "1"}})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError):
        TABLE.alias("x", "nothing")


def test_micro_dollars_round_half_even() -> None:
    """Whole micro-dollars for display, half to even."""
    assert micro_dollars(Decimal("0.0000125")) == 12
    assert micro_dollars(Decimal("0.0000135")) == 14
    assert micro_dollars(Decimal("12.5")) == 12_500_000
