"""Budgets of ``run.model``: reserve before a call, settle by call, all from memory.

An object's budget lives in its intent (``Intent.budget``: ``{"tokens", "cost"}``, set
by ``App.options(budget=...).start(...)`` and changed by ``App.refine(id, budget=...)``), so a
refinement is recorded like any other and a replay reads the same budget at the same
place. What is spent is never kept anywhere else: it is the ``perdure.llm.Ledger`` of
the object's memory, one settled charge per recorded ``model_call`` (keyed by the call's
position and name, so a call that failed and was retried, or is replayed, counts once)
and one charge in doubt per lost stream attempt (``model_recovered``'s estimate). After
a crash the ledger is what memory recorded.

Before a client is tried, its reservation (``perdure.llm.reservation_for``: the prompt's
tokens plus the most it may write, at the call's prices) must fit what is left; a client
whose reservation does not fit is skipped for the next in the fallback list (the reply's
record names it, "over budget"), and when none fits the object goes dormant with a
``dormant`` record (``reason: budget``) and the note ``budget exhausted: ...`` that
``App.get`` and ``perdure show`` print, until its intent is refined (or a person
decides). Since every call is checked with its reservation first, spending passes a
budget by at most what one call used beyond its reservation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NoReturn

from perdure.core.bodies import Dormant
from perdure.core.cycle import read_memory
from perdure.core.intent import Context
from perdure.core.records import Kind, Record
from perdure.engine.signals import Suspend
from perdure.llm import (
    Budget,
    Charge,
    Ledger,
    ModelRequest,
    PriceTable,
    Usage,
    counter_for_model,
    reservation_for,
)

if TYPE_CHECKING:
    from perdure.engine.run import Run
    from perdure.stores.base import Store

__all__ = [
    "budget_of",
    "call_key",
    "charge_of_call",
    "charges_of",
    "exhausted",
    "held",
    "lineage_budgets",
    "lineage_of",
    "over_budget",
    "refusal",
]

_MODEL_CALL = Kind.MODEL_CALL.value
_MODEL_RECOVERED = Kind.MODEL_RECOVERED.value


def budget_of(run: Run) -> Budget | None:
    """The budget the object's current intent sets, if any."""
    return _budget(run.intent.budget)


def _budget(body: Mapping[str, Any] | None) -> Budget | None:
    if body is None:
        return None
    cost = body.get("cost")
    return Budget(body.get("tokens"), None if cost is None else Decimal(str(cost)))


def call_key(body: Mapping[str, Any]) -> str:
    """The ledger key of a model call: its position and name (one per call, whatever
    the attempts)."""
    return f"{body['pos']}/{body['name']}"


def _tokens(usage: Mapping[str, Any]) -> int:
    total = 0
    for key in ("input_tokens", "output_tokens"):
        value = usage.get(key, 0)
        total += value if type(value) is int else 0
    return total


def charge_of_call(body: Mapping[str, Any]) -> Charge:
    """The settled charge of a ``model_call`` body (what the provider reported)."""
    cost = body.get("cost")
    return Charge(_tokens(body["reply"].get("usage") or {}),
                  None if cost is None else Decimal(str(cost)), settled=True)


def charges_of(records: Iterable[Record]) -> dict[str, Charge]:
    """The charges memory records: each call settled, each lost attempt in doubt."""
    charges: dict[str, Charge] = {}
    for rec in records:
        if rec.kind == _MODEL_CALL:
            charges[call_key(rec.body)] = charge_of_call(rec.body)
        elif rec.kind == _MODEL_RECOVERED and rec.body.get("lost_usage"):
            key = f"{call_key(rec.body)}/lost/{rec.body['attempt']}"
            charges[key] = Charge(_tokens(rec.body["lost_usage"]), Decimal(0),
                                  settled=True, in_doubt=True)
    return charges


def over_budget(ledger: Ledger, budget: Budget, sent: ModelRequest,
                prices: PriceTable | None) -> str | None:
    """Why ``sent`` may not be made under ``budget`` (``"budget exhausted: ..."``), or
    ``None`` when its reservation fits what ``ledger`` says is spent."""
    reserved, cost = reservation_for(sent, counter_for_model(sent.model),
                                     prices or PriceTable())
    return ledger.allows(budget, Usage(reserved.input_tokens, reserved.output_tokens), cost)


def refusal(run: Run, lineage: Iterable[tuple[str, Budget, Ledger]], sent: ModelRequest,
            prices: PriceTable | None) -> str | None:
    """Why ``sent`` would go over the object's own budget (its memory's ledger) or one
    of the ``lineage`` budgets over it (``lineage_of``), or ``None`` when it fits."""
    from perdure.engine.commands.model_memory import ModelMemory

    charges = ModelMemory.of(run).charges
    ledgers: list[tuple[str | None, Budget, Ledger]] = []
    own = budget_of(run)
    if own is not None and not (run.intent.budget or {}).get("lineage"):
        ledgers.append((None, own, Ledger(charges)))
    # The lineage's ledgers were read from the store; this object's calls in flight
    # (held reservations, in other branches) are not in them yet.
    flying = Ledger({f"in flight:{k}": c for k, c in charges.items() if not c.settled})
    ledgers.extend((owner, budget, ledger + flying) for owner, budget, ledger in lineage)
    for owner, budget, ledger in ledgers:
        why = over_budget(ledger, budget, sent, prices)
        if why is not None:
            return why if owner is None else f"{why} (the lineage budget of {owner})"
    return None


async def lineage_of(run: Run) -> list[tuple[str, Budget, Ledger]]:
    """The lineage budgets over the run's object with their ledgers, read from the
    store (only for a child, or an object whose own budget is a lineage budget)."""
    reader = run._lineage_budgets
    if reader is None or (run.context.parent_id is None
                          and not (run.intent.budget or {}).get("lineage")):
        return []
    found: list[tuple[str, Budget, Ledger]] = await reader()
    return found


@contextmanager
def held(run: Run, key: str, sent: ModelRequest, prices: PriceTable | None,
         lineage: bool = False) -> Iterator[None]:
    """Hold ``sent``'s reservation in the run's ledger while it is being made, so calls
    made at once (in ``run.gather`` branches) each see the others' reservations; the
    recorded reply settles it, anything else releases it (``lineage``: a lineage budget
    is over the object)."""
    if run.intent.budget is None and not lineage:
        yield
        return
    from perdure.engine.commands.model_memory import ModelMemory

    charges = ModelMemory.of(run).charges
    if key not in charges:
        reserved, cost = reservation_for(sent, counter_for_model(sent.model),
                                         prices or PriceTable())
        charges[key] = Charge(reserved.total_tokens, cost)
    try:
        yield
    finally:
        charge = charges.get(key)
        if charge is not None and not charge.settled:
            del charges[key]


def exhausted(pos: int | str, name: str, why: str, drafts: Iterable[Any] = ()) -> NoReturn:
    """Go dormant on an exhausted budget, recorded, until the intent is refined."""
    raise Suspend([*drafts, Dormant.model_budget(pos, name).draft()], ready_at=None,
                  reason=why,
                  note=f"{why} (model call {name}; refine the object's budget to go on)")


def lineage_budgets(store: Store, context: Context) -> list[tuple[str, Budget, Ledger]]:
    """The lineage budgets over the object of ``context`` (its own, if it is one, and
    its ancestors'), each with its owner's id and the ledger of everything the owner and
    its descendants recorded (read from ``store``; blocking)."""
    found: list[tuple[str, Budget, Ledger]] = []
    oid: str | None = context.object_id
    while oid is not None:
        records = store.records(oid)
        if not records:
            break
        facts = read_memory(records)
        body = facts.intent.budget
        budget = _budget(body)
        if budget is not None and body is not None and body.get("lineage"):
            found.append((oid, budget, Ledger(_subtree(store, oid, records))))
        oid = facts.context.parent_id
    return found


def _subtree(store: Store, oid: str, records: list[Record]) -> dict[str, Charge]:
    """The charges ``oid`` and all its descendants recorded, keyed by object and call."""
    charges = {f"{oid}:{k}": v for k, v in charges_of(records).items()}
    for child in store.list(parent=oid, limit=10_000):
        charges.update(_subtree(store, child.object_id, store.records(child.object_id)))
    return charges
