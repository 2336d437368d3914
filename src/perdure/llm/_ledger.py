"""A token and cost ledger with budgets, as a pure fold over calls by call id.

Before a call the engine *reserves* what it may cost (``reservation_for``: the prompt's
tokens plus the most it may write, at the table's prices) and asks the ``Ledger``
whether the ``Budget`` ``allows`` it; after the call it *settles* the reservation with
the usage the provider reported. Entries are keyed by call id, so a retried call
reserves and settles once: retries never count twice. A call that failed before it was
sent is *released*; one whose outcome is unknown (a killed stream restarted) is settled
*in doubt* with an estimate. Spending can pass a budget by at most what one settled call
used beyond its reservation, because every call is checked with its reservation first.

A cost budget needs known costs: a call whose cost is unknown (an unpriced model) is
refused under a cost budget, with the reason, rather than let through on a guess.
Ledgers add up (``+``), which is how totals roll up through a lineage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from perdure.core.usage import decimal_text
from perdure.errors import ConfigurationError
from perdure.llm._prices import PriceTable
from perdure.llm._reply import Usage
from perdure.llm._tokens import TokenCounter
from perdure.llm._types import ModelRequest

__all__ = ["Budget", "Charge", "Ledger", "reservation_for"]


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``tokens`` tokens and/or ``cost`` dollars (``None``: no limit)."""

    tokens: int | None = None
    cost: Decimal | None = None

    def __post_init__(self) -> None:
        if self.cost is not None and not isinstance(self.cost, Decimal):
            object.__setattr__(self, "cost", Decimal(str(self.cost)))
        if (self.tokens is not None and self.tokens < 0) or (
                self.cost is not None and self.cost < 0):
            raise ConfigurationError("a budget cannot be negative")


@dataclass(frozen=True, slots=True)
class Charge:
    """One call's line in the ledger: its tokens and cost (``None``: unknown), whether
    it is settled (else it is a reservation) and whether its figures are in doubt."""

    tokens: int
    cost: Decimal | None
    settled: bool = False
    in_doubt: bool = False

    def to_json(self) -> dict[str, Any]:
        """The JSON form (cost as a decimal string)."""
        cost = None if self.cost is None else decimal_text(self.cost)
        return {"tokens": self.tokens, "cost": cost,
                "settled": self.settled, "in_doubt": self.in_doubt}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Charge:
        """Rebuild from ``to_json()``."""
        cost = value.get("cost")
        return cls(int(value["tokens"]), None if cost is None else Decimal(str(cost)),
                   bool(value.get("settled")), bool(value.get("in_doubt")))


def reservation_for(request: ModelRequest, counter: TokenCounter, prices: PriceTable, *,
                    default_max_output: int = 4096) -> tuple[Usage, Decimal | None]:
    """What to reserve for ``request``: its prompt's tokens as input and the most it may
    write (``max_tokens``, else ``default_max_output``) as output, and their cost at
    ``prices`` (``None`` when the model is not priced)."""
    usage = Usage(input_tokens=counter.count_prompt(request.messages, request.tools),
                  output_tokens=request.params.max_tokens or default_max_output)
    return usage, prices.cost(request.model, usage)


class Ledger:
    """Charges by call id; immutable (every change returns a new ledger)."""

    __slots__ = ("_charges",)

    def __init__(self, charges: Mapping[str, Charge] | None = None) -> None:
        self._charges: dict[str, Charge] = dict(charges or {})

    def __repr__(self) -> str:
        return f"Ledger(calls={len(self._charges)}, tokens={self.tokens}, cost={self.cost})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ledger) and self._charges == other._charges

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._charges)))

    def __add__(self, other: Ledger) -> Ledger:
        """Both ledgers' charges (call ids must be unique across them: prefix them with
        the object id when rolling up a lineage)."""
        clash = set(self._charges) & set(other._charges)
        if clash:
            raise ValueError(f"call ids in both ledgers: {sorted(clash)[:3]}")
        return Ledger({**self._charges, **other._charges})

    def charge(self, call_id: str) -> Charge | None:
        """The charge of ``call_id``, if there is one."""
        return self._charges.get(call_id)

    @property
    def tokens(self) -> int:
        """Tokens settled and reserved."""
        return sum(c.tokens for c in self._charges.values())

    @property
    def cost(self) -> Decimal | None:
        """Dollars settled and reserved; ``None`` if any charge's cost is unknown."""
        total = Decimal(0)
        for charge in self._charges.values():
            if charge.cost is None:
                return None
            total += charge.cost
        return total

    @property
    def in_doubt(self) -> bool:
        """Whether any charge's figures are an estimate."""
        return any(c.in_doubt for c in self._charges.values())

    def allows(self, budget: Budget, usage: Usage, cost: Decimal | None) -> str | None:
        """``None`` if a call reserving ``usage`` at ``cost`` fits ``budget`` on top of
        what is charged; else why not (``"budget exhausted: ..."``)."""
        if budget.tokens is not None and self.tokens + usage.total_tokens > budget.tokens:
            return (f"budget exhausted: {self.tokens} of {budget.tokens} tokens used or "
                    f"reserved, this call may take {usage.total_tokens}")
        if budget.cost is not None:
            spent = self.cost
            if spent is None or cost is None:
                return ("budget exhausted: a cost budget is set and a cost is unknown "
                        "(set the model's price)")
            if spent + cost > budget.cost:
                return (f"budget exhausted: ${spent} of ${budget.cost} used or reserved, "
                        f"this call may cost ${cost}")
        return None

    def reserve(self, call_id: str, usage: Usage, cost: Decimal | None) -> Ledger:
        """Reserve for ``call_id`` (nothing changes if it already has a charge: a retried
        call reserves once)."""
        if call_id in self._charges:
            return self
        return Ledger({**self._charges, call_id: Charge(usage.total_tokens, cost)})

    def settle(self, call_id: str, usage: Usage, cost: Decimal | None, *,
               in_doubt: bool = False) -> Ledger:
        """Replace ``call_id``'s reservation by what it used (settling twice keeps the
        first settlement)."""
        current = self._charges.get(call_id)
        if current is not None and current.settled:
            return self
        charge = Charge(usage.total_tokens, cost, settled=True, in_doubt=in_doubt)
        return Ledger({**self._charges, call_id: charge})

    def release(self, call_id: str) -> Ledger:
        """Drop ``call_id``'s reservation (the call was never sent); a settled charge
        stays."""
        current = self._charges.get(call_id)
        if current is None or current.settled:
            return self
        return Ledger({k: v for k, v in self._charges.items() if k != call_id})

    def to_json(self) -> dict[str, Any]:
        """The JSON form: call id → charge."""
        return {k: v.to_json() for k, v in sorted(self._charges.items())}

    @classmethod
    def from_json(cls, value: Mapping[str, Mapping[str, Any]]) -> Ledger:
        """Rebuild from ``to_json()``."""
        return cls({str(k): Charge.from_json(v) for k, v in value.items()})
