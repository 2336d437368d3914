"""Intent and context: what an object is trying to do, and who it is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from perdure.core.codec import detached

__all__ = ["Context", "Intent", "budget_body"]


def budget_body(value: Any) -> dict[str, Any] | None:
    """A model-call budget as an intent holds it: ``{"tokens": int | None, "cost": str |
    None}`` (cost in dollars, a decimal string), plus ``"lineage": true`` for a budget of
    the object and all its descendants. ``value`` is ``None`` (no budget), a mapping
    with ``tokens`` and/or ``cost`` (and ``lineage``), or an object with those
    attributes (a ``perdure.llm.Budget``); ``ValueError`` for anything else or a
    negative limit."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        unknown = set(value) - {"tokens", "cost", "lineage"}
        if unknown:
            raise ValueError(f"a budget has tokens, cost and lineage, not {sorted(unknown)}")
        tokens, cost = value.get("tokens"), value.get("cost")
        lineage = value.get("lineage", False)
        if not isinstance(lineage, bool):
            raise ValueError("a budget's lineage must be true or false")
    elif hasattr(value, "tokens") and hasattr(value, "cost"):
        tokens, cost, lineage = value.tokens, value.cost, False
    else:
        raise ValueError(f"a budget is a mapping of tokens and cost, not {value!r}")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or tokens < 0):
        raise ValueError("a budget's tokens must be a whole number, 0 or more")
    if cost is not None:
        try:
            amount = Decimal(str(cost))
        except InvalidOperation:
            raise ValueError(f"a budget's cost must be a number of dollars, not {cost!r}"
                             ) from None
        if isinstance(cost, bool) or not amount.is_finite() or amount < 0:
            raise ValueError("a budget's cost must be 0 or more dollars")
        cost = str(amount)
    if tokens is None and cost is None:
        return None
    body: dict[str, Any] = {"tokens": tokens, "cost": cost}
    if lineage:
        body["lineage"] = True
    return body


@dataclass(frozen=True, slots=True)
class Intent:
    """What the object is trying to do. Refined by appending records, never re-instantiated."""

    agent: str
    version: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    deadline: float | None = None  # seconds since the epoch
    max_failures: int | None = None  # None: the node policy's default
    requires: tuple[str, ...] = ()
    goal: dict[str, Any] = field(default_factory=dict)  # free-form objective, refinable
    version_no: int = 1  # intent version, bumped by each refinement
    budget: dict[str, Any] | None = None  # model calls' budget (``budget_body``)
    #: Seconds since the epoch before which the object does not run (a delayed start).
    start_at: float | None = None

    def to_body(self) -> dict[str, Any]:
        """Encode as a JSON object for a memory record (``budget`` and ``start_at`` only
        when set, so an intent without them encodes as it always did)."""
        body = asdict(self)
        body["args"] = list(self.args)
        body["requires"] = list(self.requires)
        if self.budget is None:
            del body["budget"]
        if self.start_at is None:
            del body["start_at"]
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Intent:
        """Decode from a memory record body."""
        return cls(
            agent=str(body["agent"]),
            version=str(body["version"]),
            args=tuple(detached(list(body.get("args", ())))),
            kwargs=detached(dict(body.get("kwargs", {}))),
            deadline=body.get("deadline"),
            max_failures=body.get("max_failures"),
            requires=tuple(body.get("requires", ())),
            goal=detached(dict(body.get("goal", {}))),
            version_no=int(body.get("version_no", 1)),
            budget=budget_body(body.get("budget")),
            start_at=body.get("start_at"),
        )

    def debounced(self, start: dict[str, Any]) -> Intent:
        """The next intent version of a debounced object that has not run yet, taking a
        later start's ``args``, ``kwargs``, ``start_at`` (and ``deadline``, if it gave
        one); ``ValueError`` for a value of the wrong kind (nothing recorded then)."""
        args, kwargs, start_at = start.get("args"), start.get("kwargs"), start.get("start_at")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ValueError("a debounced start's args are a list and its kwargs a mapping")
        if isinstance(start_at, bool) or not isinstance(start_at, int | float):
            raise ValueError("a debounced start's start_at is a number")
        deadline = start.get("deadline", self.deadline)
        if isinstance(deadline, bool) or not isinstance(deadline, int | float | None):
            raise ValueError("a debounced start's deadline is a number or None")
        return replace(self, version_no=self.version_no + 1, args=tuple(args),
                       kwargs=dict(kwargs), start_at=float(start_at), deadline=deadline)

    def refined(self, changes: dict[str, Any]) -> Intent:
        """Return the next intent version with ``changes`` applied."""
        allowed = {"deadline", "max_failures", "goal", "requires", "budget"}
        unknown = set(changes) - allowed
        if unknown:
            raise ValueError(f"intent fields {sorted(unknown)} cannot be refined")
        updates: dict[str, Any] = dict(changes)
        # A value of the wrong type would be written to memory and then fail every
        # later read of it: refuse it here, before anything is recorded.
        if "goal" in updates and not isinstance(updates["goal"], dict):
            raise ValueError("goal must be a dict (a JSON object)")
        for name in ("deadline", "max_failures"):
            value = updates.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float | None):
                raise ValueError(f"{name} must be a number or None")
        if "requires" in updates:
            needs = updates["requires"]
            if isinstance(needs, str) or not all(isinstance(n, str) for n in needs):
                raise ValueError("requires must be a collection of capability names")
            updates["requires"] = tuple(needs)
        if "budget" in updates:
            updates["budget"] = budget_body(updates["budget"])
        return replace(self, version_no=self.version_no + 1, **updates)


@dataclass(frozen=True, slots=True)
class Context:
    """Identity, lineage, trust scope and labels a node checks before touching the object."""

    object_id: str
    trace_id: str
    parent_id: str | None = None
    root_id: str | None = None
    depth: int = 0
    tenant: str | None = None
    trust_scope: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    #: The object this one was forked from (``App.fork``): ``{"object_id", "seq",
    #: "hash"}`` of the original's last record it copied; ``None`` for any other object.
    forked_from: dict[str, Any] | None = None

    def to_body(self) -> dict[str, Any]:
        """Encode as a JSON object for a memory record (``forked_from`` only when set,
        so the context of any other object encodes as it always did)."""
        body = asdict(self)
        if self.forked_from is None:
            del body["forked_from"]
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Context:
        """Decode from a memory record body."""
        return cls(
            object_id=str(body["object_id"]),
            trace_id=str(body["trace_id"]),
            parent_id=body.get("parent_id"),
            root_id=body.get("root_id"),
            depth=int(body.get("depth", 0)),
            tenant=body.get("tenant"),
            trust_scope=str(body.get("trust_scope", "default")),
            labels=dict(body.get("labels", {})),
            forked_from=(dict(body["forked_from"]) if isinstance(body.get("forked_from"), dict)
                         else None),
        )
