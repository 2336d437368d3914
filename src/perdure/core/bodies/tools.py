"""Bodies of tool calls: proposals, gate decisions, people's decisions, results.

A tool call sits at one position of the agent's memory (``cmd`` ``tool``, ``name`` the
tool) and its records follow each other there: ``tool_proposed`` (the model's call:
arguments in canonical JSON and their hash, and the model call that produced it),
``tool_gated`` (the gate's verdict, with the policy's reference and the rule), for a
call waiting for a person a ``dormant`` record and then ``tool_decided`` (approve,
reject, edit or expire; signed by the approving client: its identity, its key and the
seal's digest), ``tool_started`` before a non-idempotent tool runs, and
``tool_result`` (what the model is told: the result, or why the call did not run). An
edit is a new ``tool_proposed`` at the same position (``revision`` one higher, naming
the proposal it edits) that goes through the gate again.

For an agent that encrypts all, what the call says is sealed under the object's data
key (``Sealed`` in place of the text): a proposal's ``args``, the gate's ``reason``
(it may quote an argument), a decision's ``edit`` and a result's ``result`` and
``error``; the names, ids, verdicts, hashes and outcomes stay in clear for routing,
listing and verification. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from perdure.core.bodies.fields import JSON, Body, BodyReader, Position, put
from perdure.core.records import Kind

__all__ = ["DECIDED", "DECISIONS", "TOOL_OUTCOMES", "VERDICTS", "Sealed", "ToolDecided",
           "ToolGated", "ToolProposed", "ToolResult", "ToolStarted"]

Sealed = dict[str, Any]
"""A sealed value in place of a text (``{"perdure:sealed": {...}}``); opened, the text."""

VERDICTS = ("allow", "deny", "approval")
DECIDED = {"approve": "approved", "reject": "rejected", "edit": "edited",
           "expire": "expired"}
"""Each decision a person (or the deadline) makes, and the word that says it was made."""
DECISIONS = tuple(DECIDED)
TOOL_OUTCOMES = ("done", "failed", "denied", "rejected", "expired", "in_doubt")


def _head(fields: BodyReader) -> tuple[Position, str, str]:
    pos = fields.position("pos")
    fields.const("cmd", "tool")
    return pos, fields.text("name"), fields.text("proposal")


@dataclass(frozen=True, slots=True)
class ToolProposed(Body):
    """The model proposed calling tool ``name`` with ``args`` (canonical JSON text,
    ``args_hash``) as ``call_id``, in the model call at position ``model_call``;
    ``proposal`` is its id (``<pos>:<revision>``); an edit names the one it replaces.
    ``args_hash`` is the SHA-256 of the canonical text, keyed (HMAC) under the object's
    data key when the arguments are sealed (``perdure.core.gate.args_digest``)."""

    kind: ClassVar[Kind] = Kind.TOOL_PROPOSED
    pos: Position
    name: str
    proposal: str
    revision: int
    call_id: str
    args: str | Sealed
    args_hash: str
    model_call: str
    edited_from: str | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"pos": self.pos, "cmd": "tool", "name": self.name,
                                "proposal": self.proposal, "revision": self.revision,
                                "call_id": self.call_id, "args": self.args,
                                "args_hash": self.args_hash, "model_call": self.model_call}
        put(body, "edited_from", self.edited_from)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> ToolProposed:
        pos, name, proposal = _head(fields)
        return cls(pos, name, proposal, fields.integer("revision"), fields.text("call_id"),
                   fields.text_or_sealed("args"), fields.text("args_hash"),
                   fields.text("model_call"),
                   fields.optional_text("edited_from"))


@dataclass(frozen=True, slots=True)
class ToolGated(Body):
    """The gate's ``verdict`` on proposal ``proposal`` (``args_hash``): why, under which
    ``policy`` (``name@hash``) and ``rule``, the tool's ``risk``, who may approve
    (empty: any trusted identity) and when a pending approval expires."""

    kind: ClassVar[Kind] = Kind.TOOL_GATED
    pos: Position
    name: str
    proposal: str
    args_hash: str
    verdict: str
    reason: str | Sealed
    policy: str
    rule: str
    risk: str
    approvers: tuple[str, ...] = ()
    expires_at: float | None = None

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "tool", "name": self.name, "proposal": self.proposal,
                "args_hash": self.args_hash, "verdict": self.verdict, "reason": self.reason,
                "policy": self.policy, "rule": self.rule, "risk": self.risk,
                "approvers": list(self.approvers), "expires_at": self.expires_at}

    @classmethod
    def read(cls, fields: BodyReader) -> ToolGated:
        pos, name, proposal = _head(fields)
        return cls(pos, name, proposal, fields.text("args_hash"),
                   fields.choice("verdict", VERDICTS), fields.text_or_sealed("reason"),
                   fields.text("policy"), fields.text("rule"), fields.text("risk"),
                   fields.texts("approvers"), fields.nullable_number("expires_at"))


@dataclass(frozen=True, slots=True)
class ToolDecided(Body):
    """A person decided on proposal ``proposal`` (naming its ``args_hash``):
    ``approve``, ``reject`` (``reason``) or ``edit`` (new arguments ``edit``, canonical
    JSON), signed by ``identity`` with ``key`` (hex Ed25519 public key) in the sealed
    event whose digest is ``event_hash``; or ``expire`` (no decision by the deadline).
    ``evidence`` keeps what the signature covers (the event's ``payload`` text, its
    ``dedupe_key`` and its ``seal``), so anyone can check it again later
    (``perdure.approvals.decision_problem``)."""

    kind: ClassVar[Kind] = Kind.TOOL_DECIDED
    pos: Position
    name: str
    proposal: str
    args_hash: str
    decision: str
    reason: str
    identity: str
    key: str
    event_hash: str | None = None
    edit: str | Sealed | None = None
    evidence: dict[str, Any] | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"pos": self.pos, "cmd": "tool", "name": self.name,
                                "proposal": self.proposal, "args_hash": self.args_hash,
                                "decision": self.decision, "reason": self.reason,
                                "identity": self.identity, "key": self.key}
        put(body, "event_hash", self.event_hash)
        put(body, "edit", self.edit)
        put(body, "evidence", self.evidence)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> ToolDecided:
        pos, name, proposal = _head(fields)
        return cls(pos, name, proposal, fields.text("args_hash"),
                   fields.choice("decision", DECISIONS), fields.text("reason"),
                   fields.text("identity"), fields.text("key"),
                   fields.optional_text("event_hash"), fields.optional_text_or_sealed("edit"),
                   fields.optional_mapping("evidence"))


@dataclass(frozen=True, slots=True)
class ToolStarted(Body):
    """A non-idempotent tool is about to run proposal ``proposal`` with idempotency
    ``key``: a crash before its result leaves the call in doubt, never run twice."""

    kind: ClassVar[Kind] = Kind.TOOL_STARTED
    pos: Position
    name: str
    proposal: str
    key: str

    def encode(self) -> dict[str, Any]:
        return {"pos": self.pos, "cmd": "tool", "name": self.name, "proposal": self.proposal,
                "key": self.key}

    @classmethod
    def read(cls, fields: BodyReader) -> ToolStarted:
        pos, name, proposal = _head(fields)
        return cls(pos, name, proposal, fields.text("key"))


@dataclass(frozen=True, slots=True)
class ToolResult(Body):
    """How tool call ``proposal`` ended (``outcome``): ``done`` with ``result``, or
    ``failed``, ``denied``, ``rejected``, ``expired``, ``in_doubt`` with ``error`` (what
    the model is told); ``latency`` in seconds for a call that ran."""

    kind: ClassVar[Kind] = Kind.TOOL_RESULT
    pos: Position
    name: str
    proposal: str
    outcome: str
    result: JSON = None
    error: str | Sealed | None = None
    latency: float | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"pos": self.pos, "cmd": "tool", "name": self.name,
                                "proposal": self.proposal, "outcome": self.outcome}
        if self.outcome == "done":
            body["result"] = self.result
        put(body, "error", self.error)
        put(body, "latency", self.latency)
        return body

    @classmethod
    def read(cls, fields: BodyReader) -> ToolResult:
        pos, name, proposal = _head(fields)
        outcome = fields.choice("outcome", TOOL_OUTCOMES)
        result = fields.value("result") if outcome == "done" else None
        return cls(pos, name, proposal, outcome, result,
                   fields.optional_text_or_sealed("error"),
                   fields.optional_number("latency"))
