"""Bodies of waiting and of children: dormancy, timers, events, delegation.

Each class encodes to exactly the dict the engine writes and reads it back from a
stored body (see ``perdure.core.bodies``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from perdure.core.bodies.fields import JSON, Body, BodyReader, MalformedBodyError, Position, put
from perdure.core.records import Kind

__all__ = ["NO_RESULT", "OUTCOMES", "ChildFinished", "Delegated", "Dormant", "EventReceived",
           "EventRefused", "WaitTimedOut", "Woke"]

OUTCOMES = ("completed", "failed", "cancelled")
"""How an object can end: the ``outcome`` of ``terminated`` and ``child_finished``."""


class _NoResult:
    """The type of ``NO_RESULT``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_RESULT"


NO_RESULT: Any = _NoResult()
"""The ``result`` of a ``ChildFinished`` whose child's signal said ``completed`` and
carried no result (perdure's own signals always carry one): the key is left out."""

# What a dormant body holds beside pos, cmd, reason and wake_at, by the command that
# went dormant.
_DORMANT_KEYS: dict[str, tuple[str, ...]] = {
    "sleep": ("seconds",),
    "step": ("name",),  # a retry of the step, due at wake_at
    "model": ("name",),  # a retry of a model call, due at wake_at
    "wait": ("name", "event"),
    "join": ("name", "children", "event"),
    "gather": ("event", "children"),
    "tool": ("name", "event"),  # a tool call waiting for a person's decision
}


@dataclass(frozen=True, slots=True)
class Dormant(Body):
    """The object went dormant at command ``pos``: why (``reason``), until when
    (``wake_at``, which holds null when only what it waits for can wake it) and for what.

    Which of ``name``, ``event``, ``children`` and ``seconds`` the body holds depends on
    ``cmd``, as the constructors build them: ``sleep`` (seconds), ``step`` and ``model``
    (a retry, or for ``model`` an exhausted budget: name), ``wait`` (name and event),
    ``join`` (name, children, event) and ``gather`` (event, null when no branch waits
    for one, and children). A ``wait`` may also hold the question the agent asks
    (``prompt``, any JSON value) and the answers it offers (``choices``); the keys are
    left out when it asks none.
    """

    kind: ClassVar[Kind] = Kind.DORMANT
    pos: Position
    cmd: str
    reason: str
    wake_at: float | None
    name: str | None = None
    event: str | None = None
    children: tuple[str, ...] = ()
    seconds: float | None = None
    prompt: JSON = None
    choices: tuple[JSON, ...] | None = None

    @classmethod
    def sleep(cls, pos: Position, wake_at: float, seconds: float) -> Dormant:
        """``run.sleep(seconds)``, due at ``wake_at``."""
        return cls(pos, "sleep", "sleep", wake_at, seconds=seconds)

    @classmethod
    def retry(cls, pos: Position, name: str, wake_at: float) -> Dormant:
        """Step ``name`` failed; its next attempt is due at ``wake_at``."""
        return cls(pos, "step", "retry", wake_at, name=name)

    @classmethod
    def model_retry(cls, pos: Position, name: str, wake_at: float) -> Dormant:
        """Model call ``name`` failed; a client may be tried again at ``wake_at``."""
        return cls(pos, "model", "retry", wake_at, name=name)

    @classmethod
    def model_budget(cls, pos: Position, name: str) -> Dormant:
        """Model call ``name`` would go over the budget: dormant until the intent is
        refined (nothing but an event wakes it)."""
        return cls(pos, "model", "budget", None, name=name)

    @classmethod
    def approval(cls, pos: Position, tool: str, event: str, wake_at: float | None
                 ) -> Dormant:
        """A call of ``tool`` waits for a person's decision (``event``), or until the
        approval expires at ``wake_at`` (``None``: never)."""
        return cls(pos, "tool", "approval", wake_at, name=tool, event=event)

    @classmethod
    def wait(cls, pos: Position, event: str, wake_at: float | None, prompt: JSON = None,
             choices: tuple[JSON, ...] | None = None, watch: Sequence[str] = ()) -> Dormant:
        """``run.wait_for(event)``, timing out at ``wake_at`` (``None``: never), asking
        ``prompt`` with ``choices`` (``None``: none); a schedule's wait also ends when the
        runs it ``watch``es have all ended (``children``, left out when empty)."""
        return cls(pos, "wait", "event", wake_at, name=event, event=event, prompt=prompt,
                   choices=choices, children=tuple(watch))

    @classmethod
    def join(cls, pos: Position, children: Sequence[str], event: str) -> Dormant:
        """``run.join(...)`` of ``children``, woken by their signals (``event``)."""
        return cls(pos, "join", "children", None, name=",".join(children), event=event,
                   children=tuple(children))

    @classmethod
    def gather(cls, pos: Position, wake_at: float | None, event: str | None,
               children: Sequence[str]) -> Dormant:
        """``run.gather(...)`` whose branches went dormant: the earliest timer, the first
        awaited event and every awaited child."""
        return cls(pos, "gather", "gather", wake_at, event=event, children=tuple(children))

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"pos": self.pos, "cmd": self.cmd, "reason": self.reason,
                                "wake_at": self.wake_at}
        for key in _DORMANT_KEYS[self.cmd]:
            body[key] = list(self.children) if key == "children" else getattr(self, key)
        if self.cmd == "wait":
            put(body, "prompt", self.prompt)
            if self.choices is not None:
                body["choices"] = list(self.choices)
            if self.children:
                body["children"] = list(self.children)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> Dormant:
        pos = fields.position("pos")
        cmd = fields.choice("cmd", tuple(_DORMANT_KEYS))
        keys = _DORMANT_KEYS[cmd]
        asks = cmd == "wait"
        prompt = fields.value("prompt") if asks and fields.has("prompt") else None
        if asks and fields.has("prompt") and prompt is None:
            raise MalformedBodyError("'prompt' is null (a wait that asks nothing leaves it out)")
        choices = (tuple(fields.array("choices")) if asks and fields.has("choices")
                   else None)
        return cls(
            pos, cmd, fields.text("reason"), fields.nullable_number("wake_at"),
            name=fields.text("name") if "name" in keys else None,
            event=fields.nullable_text("event") if "event" in keys else None,
            children=(fields.texts("children")
                      if "children" in keys or (asks and fields.has("children")) else ()),
            seconds=fields.number("seconds") if "seconds" in keys else None,
            prompt=prompt, choices=choices,
        )


@dataclass(frozen=True, slots=True)
class Woke(Body):
    """A ``run.sleep`` timer was due when the agent reached it again."""

    kind: ClassVar[Kind] = Kind.WOKE
    pos: Position

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "sleep"}

    @classmethod
    def read(cls, fields: BodyReader) -> Woke:
        pos = fields.position("pos")
        fields.const("cmd", "sleep")
        return cls(pos)


@dataclass(frozen=True, slots=True)
class EventReceived(Body):
    """``run.wait_for(name)`` received inbox event ``event_id`` with ``payload``;
    ``event_hash`` is its seal's digest (empty when the run checks no seals; records
    written before events were sealed have none)."""

    kind: ClassVar[Kind] = Kind.EVENT_RECEIVED
    pos: Position
    name: str
    event_id: int
    payload: JSON
    event_hash: str | None = None

    def encode(self) -> dict[str, Any]:
        body = {"pos": self.pos, "cmd": "wait", "name": self.name, "event_id": self.event_id,
                "payload": self.payload}
        put(body, "event_hash", self.event_hash)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> EventReceived:
        pos = fields.position("pos")
        fields.const("cmd", "wait")
        return cls(pos, fields.text("name"), fields.integer("event_id"),
                   fields.value("payload"), fields.optional_text("event_hash"))


@dataclass(frozen=True, slots=True)
class WaitTimedOut(Body):
    """``run.wait_for(name, timeout=...)`` timed out: it returned ``None``."""

    kind: ClassVar[Kind] = Kind.WAIT_TIMED_OUT
    pos: Position
    name: str

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "wait", "name": self.name}

    @classmethod
    def read(cls, fields: BodyReader) -> WaitTimedOut:
        pos = fields.position("pos")
        fields.const("cmd", "wait")
        return cls(pos, fields.text("name"))


@dataclass(frozen=True, slots=True)
class EventRefused(Body):
    """Inbox event ``event_id`` was consumed without being delivered: its seal did not
    verify, or it was a replayed copy (``reason``). ``event_hash`` holds null when the
    seal gave no digest."""

    kind: ClassVar[Kind] = Kind.EVENT_REFUSED
    event_id: int
    name: str
    event_hash: str | None
    reason: str

    def encode(self) -> dict[str, Any]:
        return {"event_id": self.event_id, "name": self.name, "event_hash": self.event_hash,
                "reason": self.reason}

    @classmethod
    def read(cls, fields: BodyReader) -> EventRefused:
        return cls(fields.integer("event_id"), fields.text("name"),
                   fields.nullable_text("event_hash"), fields.text("reason"))


@dataclass(frozen=True, slots=True)
class Delegated(Body):
    """Child object ``child_id`` was created to run agent ``name`` at ``version``."""

    kind: ClassVar[Kind] = Kind.DELEGATED
    pos: Position
    name: str
    child_id: str
    version: str

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "delegate", "name": self.name,
                "child_id": self.child_id, "version": self.version}

    @classmethod
    def read(cls, fields: BodyReader) -> Delegated:
        pos = fields.position("pos")
        fields.const("cmd", "delegate")
        return cls(pos, fields.text("name"), fields.text("child_id"), fields.text("version"))


@dataclass(frozen=True, slots=True)
class ChildFinished(Body):
    """Child ``child_id`` ended (``outcome``), as its signal, inbox event ``event_id``,
    said: a completed child's ``result`` (which may be null), a failed one's ``error``;
    ``event_hash`` is the signal seal's digest (absent on records from before seals).

    The body is the signal's payload with ``event_id`` and ``event_hash`` added, so a
    signal in another shape than perdure's (``signalled`` builds the body of any) keeps
    what it carried: keys beyond the named ones, or a named key holding another type
    (a ``child_id`` that is not a string, an ``error`` that is not an object, a result
    of an outcome other than ``completed``), are in ``others``, written as they are over
    the named ones; a completed signal with no result has ``result`` ``NO_RESULT``.
    Perdure's own signals need neither, and ``decode`` refuses a body that would.
    """

    kind: ClassVar[Kind] = Kind.CHILD_FINISHED
    child_id: str
    outcome: str | None  # one of OUTCOMES (None: left out, for a signal without one)
    event_id: int
    result: JSON = None
    error: dict[str, JSON] | None = None
    event_hash: str | None = None
    others: dict[str, JSON] | None = None

    @classmethod
    def signalled(cls, payload: dict[str, Any], event_id: int, event_hash: str | None
                  ) -> ChildFinished:
        """The body for a child's terminal signal ``payload`` (a JSON object holding a
        ``child_id``), inbox event ``event_id``, whose seal's digest is ``event_hash``
        (left out when empty): the payload's keys, then ``event_id`` and the digest."""
        others = dict(payload)
        child_id = others.pop("child_id")
        if type(child_id) is not str:
            others["child_id"] = child_id  # written over the named one
            child_id = str(child_id)
        outcome = others.pop("outcome", None)
        if (outcome is not None and type(outcome) is not str) or (
                outcome is None and "outcome" in payload):
            others["outcome"] = outcome
            outcome = None
        result = others.pop("result", NO_RESULT) if outcome == "completed" else None
        error = others.pop("error", None)
        if "error" in payload and type(error) is not dict:
            others["error"] = error
            error = None
        others.pop("event_id", None)
        if event_hash:
            others.pop("event_hash", None)
        return cls(child_id, outcome, event_id, result, error, event_hash or None,
                   others or None)

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"child_id": self.child_id}
        put(body, "outcome", self.outcome)
        if self.outcome == "completed" and self.result is not NO_RESULT:
            body["result"] = self.result
        put(body, "error", self.error)
        body["event_id"] = self.event_id
        put(body, "event_hash", self.event_hash)
        if self.others:
            body.update(self.others)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> ChildFinished:
        child_id = fields.text("child_id")
        outcome = fields.choice("outcome", OUTCOMES)
        result = fields.value("result") if outcome == "completed" else None
        return cls(child_id, outcome, fields.integer("event_id"), result,
                   fields.optional_mapping("error"), fields.optional_text("event_hash"))
