"""People deciding on tool calls: what waits for approval, and approving or rejecting it.

``pending_in(records)`` reads, from one object's memory, the proposals the gate sent to
a person that nobody has decided on yet. ``approvals(app)`` lists them across the
store's dormant objects; ``decide(app, object_id, proposal_id, ...)`` sends a decision:
an event ``perdure:approval`` sealed with the deciding client's key (its identity), that
names the proposal's argument hash. The object wakes, checks the seal, the hash and the
identity against its recorded gate decision, and records the decision as
``tool_decided``; a decision that cannot count is refused on record and the call keeps
waiting. One decision per proposal: a second is refused here (``ApprovalError``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perdure.core.codec import MAX_DEPTH, decode, encode
from perdure.core.records import Kind, Record
from perdure.errors import ApprovalError, ConfigurationError

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["PendingApproval", "approvals", "decide", "pending_in"]

APPROVAL_EVENT = "perdure:approval"  # engine.commands.tools.APPROVAL_EVENT (no engine import)


@dataclass(frozen=True)
class PendingApproval:
    """A tool call waiting for a person: the object, the proposal (id and argument hash),
    the tool and its arguments, its risk, who may approve (empty: any trusted identity),
    why it needs a person, the policy, and when it was asked and expires."""

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
        try:
            arguments = decode(str(proposed["args"]).encode())
        except ValueError:
            arguments = proposed["args"]
        found.append(PendingApproval(
            str(entry["object_id"]), str(proposed["proposal"]),
            str(proposed["args_hash"]), str(proposed["name"]), arguments,
            str(gated.get("risk", "")), tuple(gated.get("approvers", ())),
            str(gated.get("reason", "")), str(gated.get("policy", "")), float(entry["at"]),
            gated.get("expires_at")))
    return found


def _pending_of(app: App, object_id: str) -> list[PendingApproval]:
    return pending_in(app.history(object_id))


def approvals(app: App, *, limit: int = 1000) -> list[PendingApproval]:
    """Every pending approval across the store's dormant objects (oldest first)."""
    found: list[PendingApproval] = []
    for row in app.store.list(status="dormant", phase=None, agent=None, parent=None,
                              limit=limit):
        if row.waiting_event == APPROVAL_EVENT:
            found.extend(_pending_of(app, row.object_id))
    found.sort(key=lambda p: (p.requested_at, p.object_id, p.proposal_id))
    return found


def decide(app: App, object_id: str, proposal_id: str, decision: str, *,
           reason: str = "", edit: Mapping[str, Any] | None = None) -> PendingApproval:
    """Send ``decision`` (``approve``, ``reject`` or ``edit``) on a pending proposal; the
    proposal decided. ``ApprovalError`` when no such proposal waits, or it was decided."""
    app._lookup(object_id)
    if not isinstance(reason, str):
        raise ConfigurationError("reason must be text")
    if decision == "edit" and not isinstance(edit, Mapping):
        raise ConfigurationError("edit must be the new arguments as a JSON object")
    pending = {p.proposal_id: p for p in _pending_of(app, object_id)}
    target = pending.get(proposal_id)
    if target is None:
        waiting = ", ".join(sorted(pending)) or "none"
        raise ApprovalError(
            f"object {object_id!r} has no proposal {proposal_id!r} waiting for approval "
            f"(waiting: {waiting}); see `perdure approvals`")
    payload: dict[str, Any] = {"proposal": proposal_id, "args_hash": target.args_hash,
                               "tool": target.tool, "decision": decision, "reason": reason}
    if edit is not None:
        payload["edit"] = dict(edit)
    data = encode(payload, what="approval decision", max_depth=MAX_DEPTH)
    # One decision per proposal and deciding client: another client (one allowed where
    # this one was refused) can still decide.
    dedupe = f"approval:{proposal_id}:{target.args_hash[:16]}:{app.node_id}"
    sent = app.store.send(object_id, APPROVAL_EVENT, data, dedupe, time.time(),
                          app._seal(object_id, APPROVAL_EVENT, data, dedupe))
    if not sent:
        raise ApprovalError(f"proposal {proposal_id!r} of object {object_id!r} was already "
                            f"decided by this client ({app.node_id}); a decision cannot be "
                            "changed")
    return target


def shown(arguments: Any) -> str:
    """Arguments as readable JSON (indented)."""
    return json.dumps(arguments, indent=2, ensure_ascii=False, sort_keys=True)
