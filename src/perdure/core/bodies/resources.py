"""Bodies of execution-state records: resources, restore reports, step checkpoints,
invalidations.

- ``ResourceHeld`` (``resource``): a live thing the agent holds, as a *descriptor* (never a
  handle). The declaration (``run.resource``) takes a position (``pos``); a later
  descriptor of the same resource (``run.checkpoint_resources``, a refresh, a release)
  names the declaration's position in ``decl`` instead and supersedes the earlier one.
- ``RestoreReport`` (``restore_report``): what a reentry restored, how long each resource
  took, what was stale or failed, and the outcome.
- ``StepCheckpoint`` (``step_checkpoint``): a progress marker inside a running step
  (``current_step().checkpoint(cursor)``), at the step's position.
- ``Invalidated`` (``invalidated``): recorded commands from ``from_pos`` on are not
  replayed any more; the agent runs them again (the records stay, for the audit).

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from perdure.core.bodies.fields import JSON, Body, BodyReader, Position, put
from perdure.core.records import Kind

__all__ = ["Invalidated", "ResourceHeld", "RestoreReport", "StepCheckpoint"]

RESOURCE_STATES = ("open", "closed")
REPORT_OUTCOMES = ("restored", "rolled_back", "parked", "failed", "moved")


@dataclass(frozen=True, slots=True)
class ResourceHeld(Body):
    """A resource's descriptor: ``type`` names its recipe (``module:Class``), ``version``
    the descriptor's format, ``on_stale`` what a stale one leads to. ``pos`` is set on
    the declaration; ``decl`` (the declaration's position) on a superseding one."""

    kind: ClassVar[Kind] = Kind.RESOURCE
    name: str
    type: str
    version: int
    descriptor: dict[str, JSON]
    state: str
    on_stale: str
    pos: Position | None = None
    decl: Position | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        put(body, "pos", self.pos)
        body.update({"cmd": "resource", "name": self.name, "type": self.type,
                     "version": self.version, "descriptor": self.descriptor,
                     "state": self.state, "on_stale": self.on_stale})
        put(body, "decl", self.decl)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> ResourceHeld:
        pos = fields.optional_position("pos")
        fields.const("cmd", "resource")
        return cls(fields.text("name"), fields.text("type"), fields.integer("version"),
                   fields.mapping("descriptor"), fields.choice("state", RESOURCE_STATES),
                   fields.text("on_stale"), pos, fields.optional_position("decl"))


@dataclass(frozen=True, slots=True)
class RestoreReport(Body):
    """One reentry's restore: per resource ``{"name", "type", "status", "seconds"}`` and
    a ``reason`` when it was stale or failed; ``outcome`` of the whole (``retry_at``: when
    a failed restore is tried again)."""

    kind: ClassVar[Kind] = Kind.RESTORE_REPORT
    outcome: str
    node: str
    seconds: float
    resources: list[dict[str, JSON]]
    retry_at: float | None = None

    def encode(self) -> dict[str, Any]:
        body = {"outcome": self.outcome, "node": self.node, "seconds": self.seconds,
                "resources": self.resources}
        put(body, "retry_at", self.retry_at)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> RestoreReport:
        return cls(fields.choice("outcome", REPORT_OUTCOMES), fields.text("node"),
                   fields.number("seconds"), fields.array("resources"),
                   fields.optional_number("retry_at"))


@dataclass(frozen=True, slots=True)
class StepCheckpoint(Body):
    """Progress inside the step at ``pos``: the ``cursor`` its code gave, the
    ``count``-th marker of that attempt."""

    kind: ClassVar[Kind] = Kind.STEP_CHECKPOINT
    pos: Position
    name: str
    attempt: int
    count: int
    cursor: JSON

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "step", "name": self.name, "attempt": self.attempt,
                "count": self.count, "cursor": self.cursor}

    @classmethod
    def read(cls, fields: BodyReader) -> StepCheckpoint:
        pos = fields.position("pos")
        fields.const("cmd", "step")
        return cls(pos, fields.text("name"), fields.integer("attempt"),
                   fields.integer("count"), fields.value("cursor"))


@dataclass(frozen=True, slots=True)
class Invalidated(Body):
    """Commands recorded at top-level positions ``from_pos`` and later are skipped by
    replay from here on (run again); ``resource`` was stale for ``reason``."""

    kind: ClassVar[Kind] = Kind.INVALIDATED
    from_pos: int
    step: str
    resource: str
    reason: str

    def encode(self) -> dict[str, Any]:
        return {"from_pos": self.from_pos, "step": self.step, "resource": self.resource,
                "reason": self.reason}

    @classmethod
    def read(cls, fields: BodyReader) -> Invalidated:
        return cls(fields.integer("from_pos"), fields.text("step"), fields.text("resource"),
                   fields.text("reason"))
