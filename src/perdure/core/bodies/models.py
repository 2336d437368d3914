"""Bodies of what ``run.model`` records: a reply, a failed attempt, a stream's batches and
what was done with a stream a crash cut short.

The values of a call (its request, the reply, the messages) are held in the JSON forms
``perdure.llm`` gives them (``split_request``, ``split_reply``, ``CallFailure.to_json``,
``StreamChunk.to_json``); nothing here imports ``perdure.llm``, so these bodies decode
without the ``perdure[llm]`` extra. Each message and tool spec is held once per object:
a ``model_call`` carries under ``blobs`` only those memory did not hold yet, by number,
and its ``request`` names the others by number. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from perdure.core.bodies.fields import JSON, Body, BodyReader, Position, put
from perdure.core.records import Kind

__all__ = ["ModelCall", "ModelChunks", "ModelFailed", "ModelRecovered", "ModelStarted"]

CMD = "model"


@dataclass(frozen=True, slots=True)
class ModelCall(Body):
    """A model call's outcome at ``pos``: the reply of client ``client`` (its index in
    the call's fallback list; ``provider`` and ``base_url`` name it).

    ``asked`` is the hash of the request the agent made (replay checks it); ``request``
    the request as sent: its model and its messages, tools and constants (base URL,
    parameters) by number (``perdure.llm`` ``_records``), with its own hash only when it
    is not ``asked`` (a fallback's model, a continued stream); ``blobs`` the values
    memory did not hold before this record, by number; ``reply`` the reply's finish
    reason, usage, ids, latency and the number of its message (its model and provider
    when they are not the request's); ``cost`` in dollars as a decimal string (absent:
    not priced); ``skipped`` the clients passed over and why; ``recovery`` what was done
    with a stream cut short, when one was. The OpenTelemetry GenAI attributes derive
    from these fields (``perdure.llm.recorded_calls``).
    """

    kind: ClassVar[Kind] = Kind.MODEL_CALL
    pos: Position
    name: str
    attempt: int
    client: int
    provider: str
    asked: str
    request: dict[str, JSON]
    blobs: dict[str, JSON]
    reply: dict[str, JSON]
    cost: str | None
    skipped: tuple[dict[str, JSON], ...] = ()
    recovery: dict[str, JSON] | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "pos": self.pos, "cmd": CMD, "name": self.name, "attempt": self.attempt,
            "client": self.client, "provider": self.provider, "asked": self.asked,
            "request": self.request, "blobs": self.blobs, "reply": self.reply}
        put(body, "cost", self.cost)
        if self.skipped:
            body["skipped"] = list(self.skipped)
        put(body, "recovery", self.recovery)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> ModelCall:
        pos = fields.position("pos")
        fields.const("cmd", CMD)
        return cls(pos, fields.text("name"), fields.integer("attempt"),
                   fields.integer("client"), fields.text("provider"), fields.text("asked"),
                   fields.mapping("request"), fields.mapping("blobs"),
                   fields.mapping("reply"), fields.optional_text("cost"),
                   tuple(fields.array("skipped")) if fields.has("skipped") else (),
                   fields.optional_mapping("recovery"))


@dataclass(frozen=True, slots=True)
class ModelFailed(Body):
    """Attempt ``attempt`` of a model call failed on client ``client``: ``failure`` as
    ``perdure.llm.CallFailure.to_json`` gives it, ``model`` the model asked for,
    ``latency`` seconds, ``until`` when that client may be tried again (null: not for
    this call), ``final`` whether the call gave up (the agent got ``ModelCallError``),
    ``chunks`` how many chunks of a stream were journaled before it broke."""

    kind: ClassVar[Kind] = Kind.MODEL_FAILED
    pos: Position
    name: str
    attempt: int
    client: int
    provider: str
    model: str
    asked: str
    failure: dict[str, JSON]
    latency: float
    until: float | None
    final: bool
    chunks: int | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "pos": self.pos, "cmd": CMD, "name": self.name, "attempt": self.attempt,
            "client": self.client, "provider": self.provider, "model": self.model,
            "asked": self.asked, "failure": self.failure, "latency": self.latency,
            "until": self.until, "final": self.final}
        put(body, "chunks", self.chunks)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> ModelFailed:
        pos = fields.position("pos")
        fields.const("cmd", CMD)
        return cls(pos, fields.text("name"), fields.integer("attempt"),
                   fields.integer("client"), fields.text("provider"), fields.text("model"),
                   fields.text("asked"), fields.mapping("failure"), fields.number("latency"),
                   fields.nullable_number("until"), fields.flag("final"),
                   fields.optional_integer("chunks"))


@dataclass(frozen=True, slots=True)
class ModelChunks(Body):
    """A batch of the stream of attempt ``attempt`` on client ``client``: ``chunks`` (as
    ``perdure.llm.StreamChunk.to_json`` gives them), the first numbered ``start``."""

    kind: ClassVar[Kind] = Kind.MODEL_CHUNKS
    pos: Position
    name: str
    attempt: int
    client: int
    asked: str
    start: int
    chunks: tuple[dict[str, JSON], ...]

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": CMD, "name": self.name, "attempt": self.attempt,
                "client": self.client, "asked": self.asked, "start": self.start,
                "chunks": list(self.chunks)}

    @classmethod
    def read(cls, fields: BodyReader) -> ModelChunks:
        pos = fields.position("pos")
        fields.const("cmd", CMD)
        return cls(pos, fields.text("name"), fields.integer("attempt"),
                   fields.integer("client"), fields.text("asked"), fields.integer("start"),
                   tuple(fields.array("chunks")))


@dataclass(frozen=True, slots=True)
class ModelRecovered(Body):
    """What attempt ``attempt`` does with the stream of the one before it, cut short
    after ``chunks`` chunks (``chars`` characters of text): ``recovery`` (``continue``,
    ``restart`` or ``surface``), chosen under the call's ``policy``, and why the stream
    stopped (``reason``). ``lost_usage`` estimates what the lost attempt was billed (a
    restart: recorded in doubt)."""

    kind: ClassVar[Kind] = Kind.MODEL_RECOVERED
    pos: Position
    name: str
    attempt: int
    recovery: str
    policy: str
    chunks: int
    chars: int
    reason: str
    lost_usage: dict[str, JSON] | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "pos": self.pos, "cmd": CMD, "name": self.name, "attempt": self.attempt,
            "recovery": self.recovery, "policy": self.policy, "chunks": self.chunks,
            "chars": self.chars, "reason": self.reason}
        put(body, "lost_usage", self.lost_usage)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> ModelRecovered:
        pos = fields.position("pos")
        fields.const("cmd", CMD)
        return cls(pos, fields.text("name"), fields.integer("attempt"),
                   fields.choice("recovery", ("continue", "restart", "surface")),
                   fields.text("policy"), fields.integer("chunks"), fields.integer("chars"),
                   fields.text("reason"), fields.optional_mapping("lost_usage"))


@dataclass(frozen=True, slots=True)
class ModelStarted(Body):
    """Attempt ``attempt`` of a model call is about to send a *stateful* request
    (Responses ``store=True`` or a ``previous_response_id``) to client ``client``.
    Written and committed before the request leaves, so that a worker dying before the
    outcome is recorded leaves the call in doubt (the provider may hold a response
    nobody saw), never silently sent again."""

    kind: ClassVar[Kind] = Kind.MODEL_STARTED
    pos: Position
    name: str
    attempt: int
    client: int
    asked: str

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": CMD, "name": self.name, "attempt": self.attempt,
                "client": self.client, "asked": self.asked}

    @classmethod
    def read(cls, fields: BodyReader) -> ModelStarted:
        pos = fields.position("pos")
        fields.const("cmd", CMD)
        return cls(pos, fields.text("name"), fields.integer("attempt"),
                   fields.integer("client"), fields.text("asked"))
