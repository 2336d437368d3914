"""Bodies of what an agent's commands record: steps, drawn values, patches, progress.

Each class encodes to exactly the dict ``engine/run.py`` writes for the command and
reads it back from a stored body (see ``perdure.core.bodies``). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

from perdure.core.bodies.fields import JSON, Body, BodyReader, Position, put
from perdure.core.records import Kind, RecordDraft, step_done_bytes

__all__ = ["Emitted", "Patched", "Progress", "StepDone", "StepFailed", "StepInDoubt", "StepStarted",
           "Value"]

# -- steps -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepStarted(Body):
    """A non-idempotent step is about to run (``key`` is its idempotency key)."""

    kind: ClassVar[Kind] = Kind.STEP_STARTED
    pos: Position
    name: str
    attempt: int
    key: str

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "step", "name": self.name, "attempt": self.attempt,
                "key": self.key}

    @classmethod
    def read(cls, fields: BodyReader) -> StepStarted:
        pos = fields.position("pos")
        fields.const("cmd", "step")
        return cls(pos, fields.text("name"), fields.integer("attempt"), fields.text("key"))


@dataclass(frozen=True, slots=True)
class StepDone(Body):
    """A step's result (``latency`` in seconds)."""

    kind: ClassVar[Kind] = Kind.STEP_DONE
    pos: Position
    name: str
    attempt: int
    latency: float
    result: JSON

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "step", "name": self.name, "attempt": self.attempt,
                "latency": self.latency, "result": self.result}

    def draft(self, result_bytes: bytes | None = None) -> RecordDraft:
        """The draft; with ``result_bytes`` (``encode(result)``, already made) the body's
        canonical bytes are put together around them instead of encoded again."""
        body_bytes = None if result_bytes is None else step_done_bytes(
            self.attempt, self.latency, self.name, self.pos, result_bytes)
        return RecordDraft(self.kind, self.encode(), body_bytes)

    @classmethod
    def read(cls, fields: BodyReader) -> StepDone:
        pos = fields.position("pos")
        fields.const("cmd", "step")
        return cls(pos, fields.text("name"), fields.integer("attempt"),
                   fields.number("latency"), fields.value("result"))


@dataclass(frozen=True, slots=True)
class StepFailed(Body):
    """A failed attempt of a step: ``error`` as ``engine.failures.error_body`` describes
    it, ``error_class`` (``backoff.ErrorClass``), ``retry_after`` (the exception's hint,
    null if none) and, unless ``final``, ``retry_at`` (when the next attempt is due)."""

    kind: ClassVar[Kind] = Kind.STEP_FAILED
    pos: Position
    name: str
    attempt: int
    error: dict[str, JSON]
    error_class: str
    latency: float
    retry_after: float | None
    final: bool
    retry_at: float | None = None

    def encode(self) -> dict[str, Any]:
        body = {"pos": self.pos, "cmd": "step", "name": self.name, "attempt": self.attempt,
                "error": self.error, "error_class": self.error_class,
                "latency": self.latency, "retry_after": self.retry_after,
                "final": self.final}
        put(body, "retry_at", self.retry_at)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> StepFailed:
        pos = fields.position("pos")
        fields.const("cmd", "step")
        return cls(pos, fields.text("name"), fields.integer("attempt"),
                   fields.mapping("error"), fields.text("error_class"),
                   fields.number("latency"), fields.nullable_number("retry_after"),
                   fields.flag("final"), fields.optional_number("retry_at"))


@dataclass(frozen=True, slots=True)
class StepInDoubt(Body):
    """A non-idempotent step started before a crash and its outcome is unknown."""

    kind: ClassVar[Kind] = Kind.STEP_IN_DOUBT
    pos: Position
    name: str
    key: str

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "step", "name": self.name, "key": self.key}

    @classmethod
    def read(cls, fields: BodyReader) -> StepInDoubt:
        pos = fields.position("pos")
        fields.const("cmd", "step")
        return cls(pos, fields.text("name"), fields.text("key"))


@dataclass(frozen=True, slots=True)
class Value(Body):
    """A value drawn by ``run.now()``, ``run.uuid()`` or ``run.random()`` (``cmd``)."""

    kind: ClassVar[Kind] = Kind.VALUE
    pos: Position
    cmd: Literal["now", "uuid", "random"]
    value: JSON

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": self.cmd, "value": self.value}

    @classmethod
    def read(cls, fields: BodyReader) -> Value:
        pos = fields.position("pos")
        cmd = cast('Literal["now", "uuid", "random"]',
                   fields.choice("cmd", ("now", "uuid", "random")))
        return cls(pos, cmd, fields.value("value"))


@dataclass(frozen=True, slots=True)
class Patched(Body):
    """``run.patched(name)`` took the new code path here."""

    kind: ClassVar[Kind] = Kind.PATCHED
    pos: Position
    name: str

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "patch", "name": self.name}

    @classmethod
    def read(cls, fields: BodyReader) -> Patched:
        pos = fields.position("pos")
        fields.const("cmd", "patch")
        return cls(pos, fields.text("name"))


@dataclass(frozen=True, slots=True)
class Progress(Body):
    """A progress note (``run.progress(**fields)``, or the engine's own); not replayed."""

    kind: ClassVar[Kind] = Kind.PROGRESS
    fields: dict[str, JSON]

    def encode(self) -> dict[str, Any]:
        return {"fields": self.fields}

    @classmethod
    def read(cls, fields: BodyReader) -> Progress:
        return cls(fields.mapping("fields"))


@dataclass(frozen=True, slots=True)
class Emitted(Body):
    """``run.emit(name, data)``: an event for whoever follows the object (its stream),
    at command ``pos``; replayed, so each is written once."""

    kind: ClassVar[Kind] = Kind.EMITTED
    pos: Position
    name: str
    data: JSON

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "emit", "name": self.name, "data": self.data}

    @classmethod
    def read(cls, fields: BodyReader) -> Emitted:
        pos = fields.position("pos")
        fields.const("cmd", "emit")
        return cls(pos, fields.text("name"), fields.value("data"))
