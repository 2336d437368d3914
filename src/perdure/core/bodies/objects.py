"""Bodies of an object's life as a whole: its start, its intent, routing, parking, its end.

Each class encodes to exactly the dict the engine writes and reads it back from a
stored body (see ``perdure.core.bodies``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any, ClassVar

from perdure.core.bodies.fields import JSON, Body, BodyReader, MalformedBodyError, Position, put
from perdure.core.bodies.waits import OUTCOMES
from perdure.core.intent import Context, Intent
from perdure.core.records import Kind

__all__ = ["CapabilityMissing", "Instantiated", "IntentRefined", "Nondeterminism", "Parked",
           "Terminated"]


def _read_budget(fields: BodyReader, key: str) -> dict[str, Any] | None:
    """A budget as ``budget_body`` writes it (``tokens`` and ``cost``, each null when
    unset, and ``lineage: true`` for a lineage budget), or ``None`` when the key is
    absent (an intent without a budget leaves it out)."""
    if not fields.has(key):
        return None
    nested = fields.nested(key)
    tokens = nested.nullable_integer("tokens")
    cost = nested.nullable_text("cost")
    if tokens is None and cost is None:
        raise MalformedBodyError(f"{key!r} sets neither tokens nor cost (no budget leaves "
                                 "the key out)")
    budget: dict[str, Any] = {"tokens": tokens, "cost": cost}
    if nested.has("lineage"):
        budget["lineage"] = nested.const_flag("lineage", True)
    nested.finish()
    return budget


# How each key of an intent is read, one entry per field of ``Intent`` (checked below):
# a field added to ``Intent`` is written by ``Intent.to_body`` at once, so it must be read
# here too, or every record holding it would fail to decode.
_INTENT_KEYS: dict[str, Callable[[BodyReader, str], Any]] = {
    "agent": BodyReader.text,
    "version": BodyReader.text,
    "args": lambda fields, key: tuple(fields.array(key)),
    "kwargs": BodyReader.mapping,
    "deadline": BodyReader.nullable_number,
    # A refinement may set a float here: kept as it is, like every number.
    "max_failures": BodyReader.nullable_number,
    "requires": BodyReader.texts,
    "goal": BodyReader.mapping,
    "version_no": BodyReader.integer,
    "budget": _read_budget,
    "start_at": BodyReader.optional_number,  # only a delayed start holds it
}


def _context_labels(fields: BodyReader, key: str) -> dict[str, str]:
    labels = fields.mapping(key)
    if not all(type(value) is str for value in labels.values()):
        raise MalformedBodyError(f"'context.{key}' holds a value that is not a string")
    return labels


# How each key of a context is read, one entry per field of ``Context`` (checked below).
_CONTEXT_KEYS: dict[str, Callable[[BodyReader, str], Any]] = {
    "object_id": BodyReader.text,
    "trace_id": BodyReader.text,
    "parent_id": BodyReader.nullable_text,
    "root_id": BodyReader.nullable_text,
    "depth": BodyReader.integer,
    "tenant": BodyReader.nullable_text,
    "trust_scope": BodyReader.text,
    "labels": _context_labels,
    "forked_from": BodyReader.optional_mapping,
}

assert set(_INTENT_KEYS) == {f.name for f in dataclass_fields(Intent)}, \
    "every field of Intent is read from an intent body"
assert set(_CONTEXT_KEYS) == {f.name for f in dataclass_fields(Context)}, \
    "every field of Context is read from a context body"


def _read_intent(fields: BodyReader, key: str) -> Intent:
    """An intent as ``Intent.to_body`` writes it: every key present but ``budget`` and
    ``start_at``, which only an intent with a budget, or a delayed start, holds."""
    nested = fields.nested(key)
    intent = Intent(**{name: read(nested, name) for name, read in _INTENT_KEYS.items()})
    nested.finish()
    return intent


def _read_context(fields: BodyReader, key: str) -> Context:
    """A context as ``Context.to_body`` writes it: every key present but
    ``forked_from``, which only a fork's holds."""
    nested = fields.nested(key)
    context = Context(**{name: read(nested, name) for name, read in _CONTEXT_KEYS.items()})
    nested.finish()
    return context


@dataclass(frozen=True, slots=True)
class Instantiated(Body):
    """The first record: the object's intent and context."""

    kind: ClassVar[Kind] = Kind.INSTANTIATED
    intent: Intent
    context: Context

    def encode(self) -> dict[str, Any]:
        return {"intent": self.intent.to_body(), "context": self.context.to_body()}

    @classmethod
    def read(cls, fields: BodyReader) -> Instantiated:
        return cls(_read_intent(fields, "intent"), _read_context(fields, "context"))


@dataclass(frozen=True, slots=True)
class IntentRefined(Body):
    """A new intent version and the ``changes`` that made it: by the agent
    (``run.refine``, at command ``pos``) or from outside (``App.refine``: inbox event
    ``event_id``, with ``event_hash`` on records written since events are sealed)."""

    kind: ClassVar[Kind] = Kind.INTENT_REFINED
    intent: Intent
    changes: dict[str, JSON]
    pos: Position | None = None
    event_id: int | None = None
    event_hash: str | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"intent": self.intent.to_body(), "changes": self.changes}
        if self.pos is not None:
            body["pos"] = self.pos
            body["cmd"] = "refine"
        put(body, "event_id", self.event_id)
        put(body, "event_hash", self.event_hash)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> IntentRefined:
        intent = _read_intent(fields, "intent")
        changes = fields.mapping("changes")
        if fields.has("pos"):
            pos = fields.position("pos")
            fields.const("cmd", "refine")
            return cls(intent, changes, pos=pos)
        return cls(intent, changes, event_id=fields.integer("event_id"),
                   event_hash=fields.optional_text("event_hash"))


@dataclass(frozen=True, slots=True)
class CapabilityMissing(Body):
    """Node ``node`` could not run the step at ``step_pos`` (at time ``at``), and the
    object went to another node. Either it lacks ``capabilities`` that step ``step``
    requires, or the step raised ``CannotDo`` (``cannot_do`` names the step, ``reason``
    says why). ``refusal`` says which, once per node and cause."""

    kind: ClassVar[Kind] = Kind.CAPABILITY_MISSING
    refusal: str
    node: str
    step_pos: Position
    at: float
    capabilities: tuple[str, ...] = ()
    step: str | None = None
    cannot_do: str | None = None
    reason: str | None = None

    @classmethod
    def lacking(cls, node: str, capabilities: Sequence[str], step: str, step_pos: Position,
                at: float) -> CapabilityMissing:
        """``node`` lacks ``capabilities`` (sorted) that ``step`` requires."""
        return cls(f"{node}:lacks:{','.join(capabilities)}", node, step_pos, at,
                   capabilities=tuple(capabilities), step=step)

    @classmethod
    def cannot(cls, node: str, step: str, reason: str, step_pos: Position,
               at: float) -> CapabilityMissing:
        """``step`` raised ``CannotDo(reason)`` on ``node``."""
        return cls(f"{node}:cannot:{step}", node, step_pos, at, cannot_do=step, reason=reason)

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"refusal": self.refusal, "node": self.node}
        if self.cannot_do is not None:
            body["cannot_do"] = self.cannot_do
            body["reason"] = self.reason
        else:
            body["capabilities"] = list(self.capabilities)
            body["step"] = self.step
        body["step_pos"] = self.step_pos
        body["at"] = self.at
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> CapabilityMissing:
        refusal, node = fields.text("refusal"), fields.text("node")
        step_pos, at = fields.position("step_pos"), fields.number("at")
        if fields.has("cannot_do"):
            return cls(refusal, node, step_pos, at, cannot_do=fields.text("cannot_do"),
                       reason=fields.text("reason"))
        return cls(refusal, node, step_pos, at, capabilities=fields.texts("capabilities"),
                   step=fields.text("step"))


@dataclass(frozen=True, slots=True)
class Parked(Body):
    """The object waits for a person (``reason``; ``code`` says what kind of reason):
    workers died ``crashes`` times in a row running it, inside step ``step`` at
    ``step_pos`` when they died inside one."""

    kind: ClassVar[Kind] = Kind.PARKED
    reason: str
    code: str
    crashes: int
    step: str | None = None
    step_pos: Position | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"reason": self.reason, "code": self.code}
        put(body, "step", self.step)
        put(body, "step_pos", self.step_pos)
        body["crashes"] = self.crashes
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> Parked:
        return cls(fields.text("reason"), fields.text("code"), fields.integer("crashes"),
                   fields.optional_text("step"), fields.optional_position("step_pos"))


@dataclass(frozen=True, slots=True)
class Nondeterminism(Body):
    """The code no longer produces this memory: at ``position`` memory holds
    ``recorded`` and the code (agent version ``agent_version``) asked for ``found``."""

    kind: ClassVar[Kind] = Kind.NONDETERMINISM
    reason: str
    position: Position
    recorded: str
    found: str
    agent_version: str

    def encode(self) -> dict[str, Any]:
        return {"reason": self.reason, "position": self.position, "recorded": self.recorded,
                "found": self.found, "agent_version": self.agent_version}

    @classmethod
    def read(cls, fields: BodyReader) -> Nondeterminism:
        return cls(fields.text("reason"), fields.position("position"), fields.text("recorded"),
                   fields.text("found"), fields.text("agent_version"))


@dataclass(frozen=True, slots=True)
class Terminated(Body):
    """The object ended (``outcome``): completed with ``result`` (which may be null), or
    cancelled or failed for ``reason``, a failure with its ``error``."""

    kind: ClassVar[Kind] = Kind.TERMINATED
    outcome: str
    result: JSON = None
    reason: str | None = None
    error: dict[str, JSON] | None = None

    @classmethod
    def completed(cls, result: JSON) -> Terminated:
        """The agent returned ``result``."""
        return cls("completed", result)

    @classmethod
    def cancelled(cls, reason: str) -> Terminated:
        """The object was cancelled."""
        return cls("cancelled", reason=reason)

    @classmethod
    def failed(cls, reason: str, error: dict[str, JSON]) -> Terminated:
        """The object failed: the agent raised, or the node ended it (``reason``)."""
        return cls("failed", reason=reason, error=error)

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"outcome": self.outcome}
        if self.outcome == "completed":
            body["result"] = self.result
        put(body, "reason", self.reason)
        put(body, "error", self.error)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> Terminated:
        outcome = fields.choice("outcome", OUTCOMES)
        result = fields.value("result") if outcome == "completed" else None
        return cls(outcome, result, fields.optional_text("reason"),
                   fields.optional_mapping("error"))
