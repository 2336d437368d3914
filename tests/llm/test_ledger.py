"""The ledger: reserve before, settle after, by call id; budgets that refuse in time."""

from __future__ import annotations

from decimal import Decimal

import pytest

from perdure.errors import ConfigurationError
from perdure.llm import (
    Budget,
    Ledger,
    Message,
    ModelParams,
    ModelRequest,
    Price,
    PriceTable,
    Usage,
    counter_for_model,
    reservation_for,
)

PRICES = PriceTable({"gpt-4o": Price("2.50", "10")})


def test_retries_never_count_twice() -> None:
    """Reserving or settling a call id again changes nothing."""
    ledger = Ledger().reserve("c1", Usage(100, 50), Decimal("0.001"))
    assert ledger.reserve("c1", Usage(999, 999), Decimal(9)) == ledger
    settled = ledger.settle("c1", Usage(100, 20), Decimal("0.0004"))
    assert settled.settle("c1", Usage(5, 5), Decimal(0)) == settled
    assert (settled.tokens, settled.cost) == (120, Decimal("0.0004"))
    assert settled.release("c1") == settled  # a settled call stays


def test_release_drops_a_reservation() -> None:
    """A call never sent gives its reservation back."""
    ledger = Ledger().reserve("c1", Usage(100, 50), Decimal(1)).release("c1")
    assert ledger.tokens == 0 and ledger.charge("c1") is None


def test_budget_refuses_before_overspending() -> None:
    """The check includes the new call's reservation; the reason says what is left."""
    budget = Budget(tokens=1000, cost=Decimal("0.01"))
    ledger = Ledger().settle("c1", Usage(600, 100), Decimal("0.004"))
    assert ledger.allows(budget, Usage(200, 100), Decimal("0.004")) is None
    reason = ledger.allows(budget, Usage(200, 200), Decimal("0.001"))
    assert reason is not None and reason.startswith("budget exhausted") and "1000" in reason
    assert ledger.allows(budget, Usage(10, 10), Decimal("0.007")) is not None


def test_a_cost_budget_needs_known_costs() -> None:
    """Under a cost budget an unknown cost is refused, not guessed; with only a token
    budget it is let through."""
    unknown = Ledger().settle("c1", Usage(10, 10), None)
    assert unknown.cost is None
    assert unknown.allows(Budget(cost=Decimal(1)), Usage(1, 1), Decimal(0)) is not None
    assert Ledger().allows(Budget(cost=Decimal(1)), Usage(1, 1), None) is not None
    assert unknown.allows(Budget(tokens=100), Usage(1, 1), None) is None


def test_in_doubt_settlement() -> None:
    """A lost attempt settled with an estimate marks the ledger in doubt."""
    ledger = Ledger().settle("c1", Usage(100, 40), Decimal("0.001"), in_doubt=True)
    assert ledger.in_doubt and not Ledger().in_doubt


def test_lineage_roll_up_and_json() -> None:
    """Ledgers add (call ids must not clash) and round-trip through JSON."""
    parent = Ledger().settle("root/c1", Usage(10, 5), Decimal("0.1"))
    child = Ledger().reserve("child/c1", Usage(3, 2), Decimal("0.2"))
    total = parent + child
    assert (total.tokens, total.cost) == (20, Decimal("0.3"))
    with pytest.raises(ValueError):
        total + child
    assert Ledger.from_json(total.to_json()) == total


def test_reservation_for_a_request() -> None:
    """A reservation is the prompt's tokens and the most the call may write, priced."""
    counter = counter_for_model("gpt-4o")
    request = ModelRequest("gpt-4o", (Message.user("Hello there"),),
                           params=ModelParams(max_tokens=50))
    usage, cost = reservation_for(request, counter, PRICES)
    assert usage == Usage(counter.count_prompt(request.messages), 50)
    assert cost == PRICES.cost("gpt-4o", usage)
    unpriced = ModelRequest("other", request.messages)
    usage, cost = reservation_for(unpriced, counter, PRICES, default_max_output=100)
    assert usage.output_tokens == 100 and cost is None


def test_bad_budget() -> None:
    """A negative budget is a configuration error."""
    with pytest.raises(ConfigurationError):
        Budget(tokens=-1)
    assert Budget(cost="0.5").cost == Decimal("0.5")  # type: ignore[arg-type]
