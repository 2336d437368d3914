"""Prices per model and the cost of a call, in exact decimal dollars.

A price is US dollars per million tokens, per kind of token (input, output, cached input
read, cache write). Costs are ``decimal.Decimal`` computed exactly (token counts times
prices scaled by 10⁻⁶: no rounding, no float drift), written to memory as decimal strings
(``"0.0000375"``); ``micro_dollars`` rounds one to whole micro-dollars for display.

No price ships with perdure: prices change, and a stale number is a made-up number.
The table is what the user sets. A model that is not in the table, or a call that used a
kind of token the table prices as unknown (cached tokens with no cached price, say), has
an *unknown* cost: ``None``, never a guess. Names match exactly (``gpt-4o-2024-08-06``
is not ``gpt-4o``; set both, or use ``alias``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from perdure.errors import ConfigurationError
from perdure.llm._reply import Usage

__all__ = ["Price", "PriceTable", "cost_of", "micro_dollars"]


def _dollars(value: object, what: str) -> Decimal:
    """A price as a Decimal: from a Decimal, an int or a decimal string (a float goes
    through its shortest repr, ``0.15`` → ``Decimal("0.15")``)."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be a number of dollars, not {value!r}")
    try:
        amount = Decimal(repr(value)) if isinstance(value, float) else Decimal(str(value))
    except (InvalidOperation, ValueError) as exc:
        raise ConfigurationError(f"{what} must be a number of dollars, not {value!r}") from exc
    if not amount.is_finite() or amount < 0:
        raise ConfigurationError(f"{what} must be a finite amount of dollars >= 0, "
                                 f"not {value!r}")
    return amount


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens. ``cached_input`` prices input tokens read from a
    prompt cache and ``cache_write_input`` those written to one; ``None`` means not
    known, and a call that used such tokens then has an unknown cost."""

    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None
    cache_write_input: Decimal | None = None

    def __init__(self, input: object, output: object,  # noqa: A002 - the price's own name
                 cached_input: object = None, cache_write_input: object = None) -> None:
        object.__setattr__(self, "input", _dollars(input, "input price"))
        object.__setattr__(self, "output", _dollars(output, "output price"))
        object.__setattr__(self, "cached_input", None if cached_input is None
                           else _dollars(cached_input, "cached input price"))
        object.__setattr__(self, "cache_write_input", None if cache_write_input is None
                           else _dollars(cache_write_input, "cache write price"))

    def to_json(self) -> dict[str, str]:
        """The JSON form: each known price as a decimal string."""
        out = {"input": str(self.input), "output": str(self.output)}
        if self.cached_input is not None:
            out["cached_input"] = str(self.cached_input)
        if self.cache_write_input is not None:
            out["cache_write_input"] = str(self.cache_write_input)
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Price:
        """Rebuild from ``to_json()`` (or any mapping with those keys)."""
        unknown = set(value) - {"input", "output", "cached_input", "cache_write_input"}
        if unknown:
            raise ConfigurationError(f"unknown price field(s) {sorted(unknown)}; a price has "
                                     "input, output, cached_input, cache_write_input")
        return cls(value["input"], value["output"], value.get("cached_input"),
                   value.get("cache_write_input"))


def cost_of(usage: Usage, price: Price) -> Decimal | None:
    """The exact cost in dollars of ``usage`` at ``price``; ``None`` if the usage has
    tokens of a kind ``price`` does not know."""
    cached, written = usage.cached_input_tokens, usage.cache_write_input_tokens
    if (cached and price.cached_input is None) or (written and price.cache_write_input is None):
        return None
    plain = max(0, usage.input_tokens - cached - written)
    total = plain * price.input + usage.output_tokens * price.output
    if cached and price.cached_input is not None:
        total += cached * price.cached_input
    if written and price.cache_write_input is not None:
        total += written * price.cache_write_input
    return Decimal(total).scaleb(-6)


def micro_dollars(cost: Decimal) -> int:
    """A cost rounded to whole micro-dollars (half to even), for display and budgets
    kept in integers."""
    return int(cost.scaleb(6).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


class PriceTable:
    """Prices by model name, set by the user; immutable (``with_price`` returns a new
    table). ``PriceTable({"gpt-4o": Price("2.50", "10", cached_input="1.25")})``, or
    from JSON: ``PriceTable.from_json({"gpt-4o": {"input": "2.50", ...}})``."""

    __slots__ = ("_prices",)

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        self._prices: dict[str, Price] = dict(prices or {})
        for model, price in self._prices.items():
            if not isinstance(price, Price):
                raise ConfigurationError(f"the price of {model!r} must be a Price, "
                                         f"not {type(price).__name__}")

    def __repr__(self) -> str:
        return f"PriceTable({sorted(self._prices)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PriceTable) and self._prices == other._prices

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._prices)))

    def __contains__(self, model: object) -> bool:
        return model in self._prices

    def with_price(self, model: str, price: Price) -> PriceTable:
        """A table with ``model`` priced at ``price`` (replacing any price it had)."""
        return PriceTable({**self._prices, model: price})

    def alias(self, model: str, same_as: str) -> PriceTable:
        """A table where ``model`` costs what ``same_as`` costs (a dated snapshot name)."""
        if same_as not in self._prices:
            raise ConfigurationError(f"cannot alias {model!r} to {same_as!r}: no price for it")
        return self.with_price(model, self._prices[same_as])

    def price(self, model: str) -> Price | None:
        """The price of ``model``, or ``None`` when it is not in the table."""
        return self._prices.get(model)

    def cost(self, model: str, usage: Usage) -> Decimal | None:
        """The exact cost in dollars of ``usage`` on ``model``; ``None`` when unknown."""
        price = self._prices.get(model)
        return None if price is None else cost_of(usage, price)

    def to_json(self) -> dict[str, dict[str, str]]:
        """The JSON form: model → price."""
        return {model: price.to_json() for model, price in sorted(self._prices.items())}

    @classmethod
    def from_json(cls, value: Mapping[str, Mapping[str, Any]]) -> PriceTable:
        """Build from model → ``{"input", "output", "cached_input", "cache_write_input"}``."""
        return cls({str(model): Price.from_json(p) for model, p in value.items()})
