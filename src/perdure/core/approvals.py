"""Approvals read from memory: which proposals wait for a person, and whether a recorded
decision holds.

Pure readers of an object's records, shared by the engine (which takes a decision), the
API (``perdure.approvals``: listing and deciding) and the dashboard. ``pending_in``
finds the proposals the gate sent to a person that nobody has decided on yet;
``check_deadline`` says whether a decision made now would come too late;
``decision_problem`` checks a ``tool_decided`` record's evidence again from memory alone.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from perdure.core.codec import decode
from perdure.core.events import APPROVAL_EVENT
from perdure.core.gate import args_digest, canonical_args, late_problem
from perdure.core.records import Kind, Record
from perdure.core.sealing import SEALED, open_sealed, sealed_shown
from perdure.errors import ApprovalExpiredError, PerdureError, SerializationError

__all__ = ["PendingApproval", "check_deadline", "decision_problem", "pending_in", "shown"]


@dataclass(frozen=True)
class PendingApproval:
    """A tool call waiting for a person: the object, the proposal (id and argument hash),
    the tool and its arguments, its risk, who may approve (empty: any trusted identity),
    why it needs a person, the policy, and when it was asked and expires. Read from
    memory that was not opened, the arguments of an agent that encrypts all are the
    sealed value as stored and the reason is ``"<sealed>"``."""

    object_id: str
    proposal_id: str
    args_hash: str
    tool: str
    arguments: Any
    risk: str
    approvers: tuple[str, ...]
    reason: str
    policy: str
    requested_at: float
    expires_at: float | None

    def to_json(self) -> dict[str, Any]:
        """The JSON form (what ``perdure approvals --json`` prints)."""
        return {"object_id": self.object_id, "proposal_id": self.proposal_id,
                "args_hash": self.args_hash, "tool": self.tool, "arguments": self.arguments,
                "risk": self.risk, "approvers": list(self.approvers), "reason": self.reason,
                "policy": self.policy, "requested_at": self.requested_at,
                "expires_at": self.expires_at}


def pending_in(records: Iterable[Record]) -> list[PendingApproval]:
    """The proposals in one object's memory that wait for a person (oldest first)."""
    latest: dict[Any, dict[str, Any]] = {}
    for rec in records:
        body = rec.body
        if body.get("cmd") != "tool":
            continue
        pos = body.get("pos")
        if rec.kind == Kind.TOOL_PROPOSED:
            latest[pos] = {"proposed": body, "gated": None, "at": rec.ts, "closed": False,
                           "object_id": rec.object_id}
        elif pos in latest and body.get("proposal") == latest[pos]["proposed"]["proposal"]:
            if rec.kind == Kind.TOOL_GATED:
                latest[pos]["gated"] = body
            elif rec.kind in (Kind.TOOL_DECIDED, Kind.TOOL_RESULT, Kind.TOOL_STARTED):
                latest[pos]["closed"] = True
        if rec.kind == Kind.TOOL_RESULT and pos in latest:
            latest[pos]["closed"] = True
    found = []
    for entry in latest.values():
        gated = entry["gated"]
        if entry["closed"] or gated is None or gated.get("verdict") != "approval":
            continue
        proposed = entry["proposed"]
        arguments = proposed["args"]
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = decode(arguments.encode())
        reason = sealed_shown(gated.get("reason", ""))
        found.append(PendingApproval(
            str(entry["object_id"]), str(proposed["proposal"]),
            str(proposed["args_hash"]), str(proposed["name"]), arguments,
            str(gated.get("risk", "")), tuple(gated.get("approvers", ())),
            str(reason), str(gated.get("policy", "")), float(entry["at"]),
            gated.get("expires_at")))
    return found


def check_deadline(target: PendingApproval, now: float) -> None:
    """``ApprovalExpiredError`` when a decision made at ``now`` on ``target`` would come
    after its deadline (the object would refuse it: the call counts as rejected)."""
    if target.expires_at is not None and late_problem(target.expires_at, now) is not None:
        raise ApprovalExpiredError(
            f"proposal {target.proposal_id!r} of object {target.object_id!r} expired "
            f"{now - target.expires_at:.0f} s ago: nobody decided by its deadline, so it "
            "counts as rejected and the tool will not run; nothing was sent")


def decision_problem(record: Record, expires_at: float | None = None, *,
                     data_key: Callable[[str], bytes] | None = None) -> str | None:
    """Check a ``tool_decided`` record's evidence again, from memory alone: the sealed
    event it kept must verify under the recorded key, come from the recorded identity and
    say what the record says (proposal, argument hash, decision, reason, edit), and, for
    a proposal whose ``tool_gated`` record gave it a deadline (``expires_at``), have been
    signed by then. ``None`` when it holds; else what does not (an ``expire`` has no
    signature to check). An edit sent to an agent that encrypts all is sealed in the
    evidence and the record: checking it needs ``data_key(object_id)``, the data key of
    the object a sealed value names (``Sealer.data_key`` gives it)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from perdure.core.trust import EventSeal, event_digest

    body = record.body
    if record.kind != Kind.TOOL_DECIDED:
        return f"record {record.seq} is a {record.kind}, not a tool_decided"
    if body.get("decision") == "expire":
        return "an expiry is no person's decision: there is no signature to check"
    evidence = body.get("evidence")
    if not isinstance(evidence, dict):
        return "the record keeps no evidence (the node checked no seals)"
    try:
        seal = EventSeal.from_bytes(str(evidence["seal"]).encode())
        payload = str(evidence["payload"]).encode()
        said = decode(payload)
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(str(body["key"])))
    except (KeyError, ValueError) as exc:
        return f"the evidence is malformed: {exc}"
    if seal.sender != body.get("identity"):
        return f"the seal is {seal.sender!r}'s, the record names {body.get('identity')!r}"
    digest = event_digest(record.object_id, APPROVAL_EVENT, payload,
                          evidence.get("dedupe_key"), seal.sender, seal.nonce)
    try:
        key.verify(seal.signature, digest)
    except InvalidSignature:
        return "the signature does not verify under the recorded key"
    if body.get("event_hash") not in (None, digest.hex()):
        return "the record's event hash is not the sealed event's"
    if not isinstance(said, dict):
        return "the signed payload is not a decision"
    late = late_problem(expires_at, said.get("decided_at"))
    if late is not None:
        return late
    if said.get("decision") == "edit":
        signed, recorded = said.get("edit") or {}, body.get("edit")
        mac_key = None
        if isinstance(signed, dict) and SEALED in signed:
            if data_key is None:
                return "the signed edit is sealed: give data_key to check it"
            try:
                mac_key = data_key(str(signed[SEALED].get("of")))
                signed = open_sealed(signed, data_key, owner=record.object_id)
                recorded = open_sealed(recorded, data_key, owner=record.object_id)
            except (AttributeError, PerdureError) as exc:
                return f"the signed edit does not open: {exc}"
        try:
            edited = canonical_args(signed)
        except (SerializationError, TypeError, ValueError):
            return "the signed edit is not a JSON object"
        if body.get("decision") == "edit" and recorded != edited:
            return "the signed edit is not the recorded one"
        if (body.get("decision") == "approve"
                and body.get("args_hash") != args_digest(edited, mac_key)):
            return "the approval with an edit names other arguments than the signed edit"
        if body.get("decision") not in ("edit", "approve"):
            return "the signed decision says something else than the record"
        if body.get("decision") == "approve":
            return None  # the editor's approval of its own edit (a new proposal id)
    named = ("proposal", "args_hash", "decision")
    if any(said.get(k) != body.get(k) for k in named):
        return "the signed decision says something else than the record"
    if str(said.get("reason") or "") != body.get("reason"):
        return "the signed reason is not the recorded one"
    return None


def shown(arguments: Any) -> str:
    """Arguments as readable JSON (indented); sealed ones as ``<sealed>``."""
    arguments = sealed_shown(arguments)
    if arguments == "<sealed>":
        return "<sealed>"
    return json.dumps(arguments, indent=2, ensure_ascii=False, sort_keys=True)
