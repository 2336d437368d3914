"""People deciding on tool calls: what waits for approval, and approving or rejecting it.

``pending_in(records)`` reads, from one object's memory, the proposals the gate sent to
a person that nobody has decided on yet. ``approvals(app)`` lists them across the
store's dormant objects; ``decide(app, object_id, proposal_id, ...)`` sends a decision:
an event ``perdure:approval`` sealed with the deciding client's key (its identity), that
names the proposal's argument hash. The object wakes, checks the seal, the hash and the
identity against its recorded gate decision, and records the decision as
``tool_decided``; a decision that cannot count is refused on record and the call keeps
waiting. One decision per proposal: a second is refused here (``ApprovalError``).

A decision carries the time it was made, signed with it (``decided_at``). A proposal
with a deadline (``Policy(approval_ttl=...)``) takes only a decision signed by then:
``decide`` refuses to send a later one (``ApprovalExpiredError``), and the object refuses
one that comes anyway, whenever it sees it, and records the call as expired (which counts
as rejected): a late decision never runs the tool.

For an agent that encrypts all, a proposal's arguments and the gate's reason are stored
sealed: ``approvals(app)`` opens them with the App's data keys (``App.open_sealed``), so
the person reads what they approve; an App that does not open (the CLI's) lists them
sealed (``"<sealed>"`` in the reason, the sealed value as stored in ``arguments``) and can
still decide by id, since a decision names the proposal's id and argument hash, both in
clear. An edit sent to such an object is sealed under its data key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from perdure.core.approvals import PendingApproval, check_deadline, pending_in
from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.events import APPROVAL_EVENT
from perdure.core.sealing import has_secrets
from perdure.errors import (
    ApprovalError,
    ConfigurationError,
)
from perdure.keys.client import lookup_id

if TYPE_CHECKING:

    from perdure.app import App

__all__ = ["approvals", "decide", "waiting_decision"]



def _pending_of(app: App, object_id: str) -> list[PendingApproval]:
    """The object's pending proposals, opened where the App opens what it reads."""
    return pending_in(app.history(object_id, opened=True))


def approvals(app: App, *, limit: int = 1000) -> list[PendingApproval]:
    """Every pending approval across the store's dormant objects (oldest first)."""
    found: list[PendingApproval] = []
    for row in app.store.list(status="dormant", phase=None, agent=None, parent=None,
                              limit=limit):
        if row.waiting_event == APPROVAL_EVENT:
            found.extend(_pending_of(app, row.object_id))
    found.sort(key=lambda p: (p.requested_at, p.object_id, p.proposal_id))
    return found


def waiting_decision(app: App, object_id: str, proposal_id: str) -> PendingApproval:
    """The one policy every sender (``perdure approve``, ``App.approve``, the dashboard)
    applies before it signs a decision: the proposal waits for a person, its deadline has
    not passed, the object's memory verifies (a decision is never signed on what a forged
    or damaged memory shows), this client's identity is among the proposal's approvers,
    and the object's workers would accept this client's key. ``ApprovalError`` (or
    ``ApprovalExpiredError``, ``ConfigurationError`` for a key the workers would refuse)
    saying why, before anything is written."""
    lookup_id(object_id)
    app.client.check_audience(object_id)  # a key its workers would refuse: say so first
    pending = {p.proposal_id: p for p in _pending_of(app, object_id)}
    target = pending.get(proposal_id)
    if target is None:
        waiting = ", ".join(sorted(pending)) or "none"
        raise ApprovalError(
            f"object {object_id!r} has no proposal {proposal_id!r} waiting for approval "
            f"(decided already, or expired; waiting: {waiting}); see `perdure approvals`")
    check_deadline(target, app.clock())
    report = app.verify(object_id)
    if not report.ok:
        raise ApprovalError(
            f"object {object_id!r}'s memory does not verify (record #{report.bad_seq}: "
            f"{report.reason}); no decision is signed on what it shows: see "
            f"`perdure verify {object_id}`")
    if target.approvers and app.node_id not in target.approvers:
        raise ApprovalError(
            f"this client decides as {app.node_id!r}, which may not decide on "
            f"{target.risk}-risk calls (allowed: {', '.join(target.approvers)}); decide "
            "with an allowed identity's key folder (--key-dir)")
    return target


def decide(app: App, object_id: str, proposal_id: str, decision: str, *,
           reason: str = "", edit: Mapping[str, Any] | None = None) -> PendingApproval:
    """Send ``decision`` (``approve``, ``reject`` or ``edit``) on a pending proposal; the
    proposal decided. ``ApprovalError`` when no such proposal waits, or it was decided."""
    if not isinstance(reason, str):
        raise ConfigurationError("reason must be text")
    if decision == "edit" and not isinstance(edit, Mapping):
        raise ConfigurationError("edit must be the new arguments as a JSON object")
    target = waiting_decision(app, object_id, proposal_id)
    now = app.clock()
    payload: dict[str, Any] = {"proposal": proposal_id, "args_hash": target.args_hash,
                               "tool": target.tool, "decision": decision, "reason": reason,
                               "decided_at": now}
    if edit is not None:
        if has_secrets(dict(edit)):
            raise ConfigurationError("an edit cannot hold a perdure.Secret: give the new "
                                     "arguments as plain JSON")
        from perdure.keys.at_rest import sealed_edit

        payload["edit"] = sealed_edit(app.store, app.data_keys, object_id, dict(edit))
    data = encode(payload, what="approval decision", max_depth=MAX_DEPTH)
    # One decision per proposal and deciding client: another client (one allowed where
    # this one was refused) can still decide.
    dedupe = f"approval:{proposal_id}:{target.args_hash[:16]}:{app.node_id}"
    sent = app.store.send(object_id, APPROVAL_EVENT, data, dedupe, now,
                          app.client.seal_event(object_id, APPROVAL_EVENT, data, dedupe))
    if not sent:
        raise ApprovalError(f"proposal {proposal_id!r} of object {object_id!r} was already "
                            f"decided by this client ({app.node_id}); a decision cannot be "
                            "changed")
    return target
