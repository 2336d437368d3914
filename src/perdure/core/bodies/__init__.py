"""Typed record bodies: one frozen class per memory record ``Kind``.

A record's body is a JSON object whose keys depend on its kind and, for a few kinds, on
what wrote it (a ``dormant`` body holds what the command that went dormant waits for; a
``terminated`` body a result, or a reason and an error). The classes here name those
keys once, for the engine that writes them and for whatever reads them
(``perdure.describe``, the CLI, a dashboard):

- ``StepDone(...).encode()`` is exactly the dict the engine writes, key for key, so
  stored bytes, hashes and signatures do not change; ``.draft()`` is the
  ``RecordDraft`` to append. Constructors such as ``Dormant.sleep(...)`` or
  ``Terminated.failed(...)`` build the shapes the engine writes.
- ``decode(record)`` (or ``decode_body(kind, body, object_id=..., seq=...)``) gives the
  typed body, failing closed: an unknown kind, a missing key, a key the kind never
  writes or a value of the wrong type raises ``RecordDecodeError`` naming the record
  and the key. Nothing is defaulted or dropped and values are kept as they are (an
  integer stays an integer), so ``decode_body(k, b).encode() == b`` and re-encoding
  gives the same canonical bytes (the golden logs in ``tests/golden`` included).

A field that is ``None`` is a key the body leaves out, unless the class says the key
holds null. JSON values memory keeps for the agent (a step's result, an event's payload,
intent arguments) are held as the body holds them, not copied.

Where they live: ``fields`` (the ``Body`` base and the reader that checks each key),
``steps`` (steps, drawn values, patches, progress), ``waits`` (dormancy, timers,
events, children), ``objects`` (start, intent, routing, parking, end) and ``models``
(model calls: replies, failed attempts, stream batches, recoveries) and ``tools`` (tool
calls: proposals, gate verdicts, people's decisions, results). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perdure.core.bodies.fields import JSON, Body, BodyReader, MalformedBodyError, Position
from perdure.core.bodies.models import (
    ModelCall,
    ModelChunks,
    ModelFailed,
    ModelRecovered,
    ModelStarted,
)
from perdure.core.bodies.objects import (
    CapabilityMissing,
    Instantiated,
    IntentRefined,
    Nondeterminism,
    Parked,
    Terminated,
)
from perdure.core.bodies.resources import (
    Invalidated,
    ResourceHeld,
    RestoreReport,
    StepCheckpoint,
)
from perdure.core.bodies.steps import (
    Emitted,
    Patched,
    Progress,
    StepDone,
    StepFailed,
    StepInDoubt,
    StepStarted,
    Value,
)
from perdure.core.bodies.tools import (
    ToolDecided,
    ToolGated,
    ToolProposed,
    ToolResult,
    ToolStarted,
)
from perdure.core.bodies.waits import (
    NO_RESULT,
    OUTCOMES,
    ChildFinished,
    Delegated,
    Dormant,
    EventReceived,
    EventRefused,
    WaitTimedOut,
    Woke,
)
from perdure.core.records import Kind, Record
from perdure.errors import RecordDecodeError

__all__ = [
    "BODY_TYPES",
    "JSON",
    "NO_RESULT",
    "OUTCOMES",
    "Body",
    "CapabilityMissing",
    "ChildFinished",
    "Delegated",
    "Dormant",
    "Emitted",
    "EventReceived",
    "EventRefused",
    "Instantiated",
    "IntentRefined",
    "Invalidated",
    "ModelCall",
    "ModelChunks",
    "ModelFailed",
    "ModelRecovered",
    "ModelStarted",
    "Nondeterminism",
    "Parked",
    "Patched",
    "Position",
    "Progress",
    "RecordBody",
    "ResourceHeld",
    "RestoreReport",
    "StepCheckpoint",
    "StepDone",
    "StepFailed",
    "StepInDoubt",
    "StepStarted",
    "Terminated",
    "ToolDecided",
    "ToolGated",
    "ToolProposed",
    "ToolResult",
    "ToolStarted",
    "Value",
    "WaitTimedOut",
    "Woke",
    "decode",
    "decode_body",
]

RecordBody = (
    Instantiated | StepStarted | StepDone | StepFailed | StepInDoubt | Value | Dormant | Woke
    | EventReceived | WaitTimedOut | IntentRefined | Nondeterminism | Delegated
    | ChildFinished | CapabilityMissing | Patched | Progress | EventRefused | Parked
    | Terminated | ModelCall | ModelFailed | ModelChunks | ModelRecovered | Emitted
    | ModelStarted
    | ResourceHeld | RestoreReport | StepCheckpoint | Invalidated
    | ToolProposed | ToolGated | ToolDecided | ToolStarted | ToolResult
)
"""Any typed body: what ``decode`` returns."""

BODY_TYPES: Mapping[str, type[RecordBody]] = {
    cls.kind.value: cls for cls in (
        Instantiated, StepStarted, StepDone, StepFailed, StepInDoubt, Value, Dormant, Woke,
        EventReceived, WaitTimedOut, IntentRefined, Nondeterminism, Delegated, ChildFinished,
        CapabilityMissing, Patched, Progress, EventRefused, Parked, Terminated,
        ModelCall, ModelFailed, ModelChunks, ModelRecovered, Emitted, ModelStarted,
        ResourceHeld, RestoreReport, StepCheckpoint, Invalidated,
        ToolProposed, ToolGated, ToolDecided, ToolStarted, ToolResult,
    )
}
"""The body class of each record kind, by the kind's value."""

assert set(BODY_TYPES) == {kind.value for kind in Kind}, "every kind has a body type"


def decode_body(kind: str, body: Mapping[str, Any], *, object_id: str, seq: int
                ) -> RecordBody:
    """The typed body of record ``seq`` of ``object_id``, of kind ``kind``.

    Fails closed with ``RecordDecodeError`` (naming the record and the key) for an
    unknown kind, a body that is not a JSON object, a missing key, a key the kind never
    writes, or a value of the wrong type.
    """
    cls = BODY_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordDecodeError(object_id, seq, f"unknown record kind {kind!r}")
    if not isinstance(body, dict):
        raise RecordDecodeError(object_id, seq, f"{kind} body is not a JSON object")
    fields = BodyReader(body)
    try:
        typed = cls.read(fields)
        fields.finish()
    except MalformedBodyError as exc:
        raise RecordDecodeError(object_id, seq, f"{kind} body: {exc.problem}") from None
    return typed


def decode(record: Record) -> RecordBody:
    """The typed body of ``record``; ``RecordDecodeError`` if it is not one its kind
    writes (see ``decode_body``)."""
    return decode_body(record.kind, record.body, object_id=record.object_id, seq=record.seq)
