"""People's decisions on tool calls, as ``run.tool`` takes them from the inbox.

A decision arrives as an event ``perdure:approval`` (one name for every proposal of an
object, so any decision wakes it) sealed by the deciding client. ``take_decision`` finds
the one for a proposal, checks its seal (``waits.vouched``), what it says (a decision of
the same tool, an edit that is a JSON object) and, through the gate's
``approval_problem``, that it names the arguments' hash the gate decided on and comes
from an identity allowed at the call's risk, and through ``late_problem`` that it was
signed by the proposal's recorded deadline (a late one is refused whenever the node
sees it, and the call then expires). A decision that cannot count is refused on
record (``event_refused``) and consumed, and the call keeps waiting; one naming a
proposal that waits for nothing (decided, edited, never asked) is refused too, so a
stale event cannot keep waking the object.

An edit to an object whose agent encrypts all comes sealed under the object's data key
(``perdure.approvals.decide`` seals it): it is opened here, and one in clear, or one that
does not open on this node, is refused, so that no edited argument reaches memory (the
decision's evidence keeps the signed payload as it came) in clear.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from perdure.core.approvals import pending_in
from perdure.core.bodies import EventRefused, ToolDecided, ToolProposed
from perdure.core.codec import decode
from perdure.core.events import APPROVAL_EVENT
from perdure.core.gate import GateDecision, approval_problem, canonical_args, late_problem
from perdure.core.sealing import SEALED, has_secrets
from perdure.core.trust import EventSeal
from perdure.engine.commands.waits import _inbox, vouched
from perdure.errors import DataKeyError, SealBrokenError

if TYPE_CHECKING:
    from perdure.engine.commands.tools import _Call
    from perdure.engine.run import Run
    from perdure.stores.base import Event

__all__ = ["take_decision"]


_WAITING: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


async def take_decision(run: Run, call: _Call, proposal: ToolProposed,
                         decision: GateDecision) -> ToolDecided | None:
    """A person's decision on ``proposal`` from the inbox, if one arrived and counts;
    decisions that cannot count are refused on record (and consumed)."""
    for ev in await _inbox(run, APPROVAL_EVENT):
        if ev.name != APPROVAL_EVENT or ev.event_id in run._consumed:
            continue
        try:
            payload = decode(ev.payload)
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or payload.get("proposal") is None:
            continue
        named = str(payload.get("proposal"))
        if named != proposal.proposal:
            if named not in _waiting(run):  # decided already, edited, or never asked
                _refuse(run, call, ev.event_id, ev.name, None,
                        f"proposal {named} does not wait for a decision")
            continue  # another call's (a branch of the same gather)
        run._consumed.add(ev.event_id)
        digest = vouched(run, ev)
        if digest is None:
            continue  # refused (bad seal or a replayed copy), on record
        identity, key = _sender(run, ev)
        payload, problem = _opened_edit(run, payload)
        if problem is None:
            problem = _payload_problem(payload, call.name)
        if problem is None:
            problem = approval_problem(decision, proposal.args_hash,
                                       str(payload.get("args_hash")), identity)
        if problem is None:
            problem = late_problem(decision.expires_at, payload.get("decided_at"))
        if problem is not None:
            _refuse(run, call, ev.event_id, ev.name, digest, problem)
            continue
        call.consumed.append(ev.event_id)
        verdict = str(payload["decision"])
        edit = canonical_args(payload["edit"]) if verdict == "edit" else None
        evidence = {"payload": ev.payload.decode("utf-8", "replace"),
                    "dedupe_key": ev.dedupe_key,
                    "seal": ev.seal.decode("utf-8", "replace")} if ev.seal else None
        return ToolDecided(call.pos, call.name, proposal.proposal, proposal.args_hash,
                           verdict, str(payload.get("reason") or ""), identity, key,
                           digest or None, edit, evidence)
    return None


def _waiting(run: Run) -> set[str]:
    """The proposals memory (as read at this claim) holds as waiting for a person."""
    found = _WAITING.get(run)
    if found is None:
        records = sorted((rec for recs in run._history.values() for rec in recs),
                         key=lambda rec: rec.seq)
        found = {p.proposal_id for p in pending_in(records)}
        _WAITING[run] = found
    return found


def _opened_edit(run: Run, payload: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``payload`` with its edit opened, or why the edit cannot count (see the module)."""
    edit = payload.get("edit")
    if edit is None:
        return payload, None
    sealed = isinstance(edit, dict) and SEALED in edit
    sealer = run._sealer
    if not sealed:
        if sealer is not None and sealer.seal_all:
            return payload, ("the edit is in clear, and this object keeps everything its "
                             "agent writes sealed: send the edit sealed under its data key "
                             "(`perdure approve --edit` and app.approve do)")
        return payload, None
    try:
        opened = run._opened(edit)
    except (DataKeyError, SealBrokenError) as exc:
        return payload, f"the edit's sealed arguments do not open here: {exc}"
    if has_secrets(opened):
        return payload, "an edit cannot hold a perdure.Secret"
    return {**payload, "edit": opened}, None


def _payload_problem(payload: Mapping[str, Any], tool: str) -> str | None:
    verdict = payload.get("decision")
    if verdict not in ("approve", "reject", "edit"):
        return f"decision {verdict!r} is not approve, reject or edit"
    if payload.get("tool", tool) != tool:
        return (f"the decision names tool {payload.get('tool')!r}; an edit cannot turn a "
                f"call of {tool!r} into another tool")
    if verdict == "edit" and not isinstance(payload.get("edit"), dict):
        return "an edit must give the new arguments as a JSON object"
    if not isinstance(payload.get("reason", ""), str):
        return "the reason must be text"
    return None


def _refuse(run: Run, call: _Call, event_id: int, name: str, digest: str | None,
            problem: str) -> None:
    run._consumed.add(event_id)
    call.drafts.append(EventRefused(event_id, name, digest, problem).draft())
    call.consumed.append(event_id)
    run.refused.append((event_id, name, problem))


def _sender(run: Run, ev: Event) -> tuple[str, str]:
    """The identity that sealed a decision (the name its key's certificate carries: the
    seal was checked against it) and its public key (hex; empty when the node checks no
    seals)."""
    try:
        sender = EventSeal.from_bytes(ev.seal).sender
    except ValueError:
        return "", ""
    verifier = getattr(run._check_event, "__self__", None)
    event_key = getattr(verifier, "event_key", None)
    key = event_key(ev) if event_key is not None else None
    return sender, key.hex() if key else ""
