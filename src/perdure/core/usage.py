"""What an object's model calls used and cost, totalled from its memory.

Every ``model_call`` record holds the usage the provider reported and the call's cost (a
decimal string, or null when the model was not priced); a ``model_recovered`` record of a
restarted stream holds an estimate of what the lost attempt was billed, which counts as
*in doubt*, never as known. ``usage_totals(records)`` adds them up; totals add up too
(``+``), which is how they roll up over a lineage. Costs are exact ``Decimal`` dollars,
the sum of the calls whose cost is known; ``unpriced`` says how many calls it leaves out
(their model had no price), so a partial sum is never taken for the whole. Pure: no I/O,
and no need of the ``perdure[llm]`` extra.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from perdure.core.records import Kind, Record

__all__ = ["UsageTotals", "decimal_text", "usage_totals"]

_MODEL_CALL = Kind.MODEL_CALL.value
_MODEL_FAILED = Kind.MODEL_FAILED.value
_MODEL_RECOVERED = Kind.MODEL_RECOVERED.value


def decimal_text(value: Decimal) -> str:
    """An exact amount as people and JSON readers write it: positional, never in exponent
    form (``0``, not ``0E-8``; ``0.0000001``, not ``1E-7``)."""
    return "0" if not value else f"{value:f}"


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Model calls of one object (or a lineage): how many answered (``calls``) and how
    many attempts failed, the tokens providers reported, the cost in dollars of the calls
    whose cost is known (``unpriced`` calls are not in it), ``in_doubt_tokens`` (an
    estimate of what lost stream attempts were billed) and how many ``objects`` the
    totals cover."""

    calls: int = 0
    failed_attempts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost: Decimal = Decimal(0)
    unpriced: int = 0
    in_doubt_tokens: int = 0
    objects: int = 1

    def __add__(self, other: UsageTotals) -> UsageTotals:
        return UsageTotals(
            self.calls + other.calls, self.failed_attempts + other.failed_attempts,
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens, self.cost + other.cost,
            self.unpriced + other.unpriced, self.in_doubt_tokens + other.in_doubt_tokens,
            self.objects + other.objects)

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens the providers reported."""
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, Any]:
        """The JSON form (cost as a decimal string)."""
        return {"calls": self.calls, "failed_attempts": self.failed_attempts,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_input_tokens": self.cached_input_tokens,
                "cost": decimal_text(self.cost),
                "unpriced": self.unpriced, "in_doubt_tokens": self.in_doubt_tokens,
                "objects": self.objects}


def _tokens(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key, 0)
    return value if type(value) is int else 0


def usage_totals(records: Iterable[Record]) -> UsageTotals:
    """The totals of one object's memory (records of other kinds are passed over)."""
    calls = failed = input_tokens = output_tokens = cached = unpriced = in_doubt = 0
    cost = Decimal(0)
    for rec in records:
        kind = rec.kind
        if kind == _MODEL_CALL:
            body = rec.body
            usage = body["reply"].get("usage", {})
            calls += 1
            input_tokens += _tokens(usage, "input_tokens")
            output_tokens += _tokens(usage, "output_tokens")
            cached += _tokens(usage, "cached_input_tokens")
            if body.get("cost") is None:
                unpriced += 1
            else:
                cost += Decimal(str(body["cost"]))
        elif kind == _MODEL_FAILED:
            failed += 1
        elif kind == _MODEL_RECOVERED:
            lost = rec.body.get("lost_usage") or {}
            in_doubt += _tokens(lost, "input_tokens") + _tokens(lost, "output_tokens")
    return UsageTotals(calls, failed, input_tokens, output_tokens, cached, cost, unpriced,
                       in_doubt)
