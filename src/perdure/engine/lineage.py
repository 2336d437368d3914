"""Parents and children: creating a child, signalling a parent, folding children's results.

A child is created idempotently on its id (a replay re-creating it finds it there).
When an object ends, its terminal signal for the parent is written in the same
transaction as its terminal record, sealed by this node. A parent folds its
children's signals into memory in the delegation phase, without running its agent:
the agent runs once, when everything it awaits is there.
"""

from __future__ import annotations

import os
from typing import Any

from perdure.core.bodies import Progress
from perdure.core.codec import encode
from perdure.core.intent import Context
from perdure.core.lifecycle import Phase
from perdure.core.records import Kind, Record, RecordDraft
from perdure.core.trust import seal_event
from perdure.engine.instantiate import instantiate
from perdure.engine.journal import Journal
from perdure.engine.memory import event_refusal
from perdure.engine.node import Node
from perdure.engine.run import CHILD_EVENT, child_finished_body
from perdure.errors import ObjectConflictError, UnknownAgentError
from perdure.keys.sealer import needs_sealing, sealed_arguments
from perdure.stores.base import Event, Signal

__all__ = ["fold_children", "parent_signal", "spawn"]


async def spawn(node: Node, agent: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                child_id: str, parent: Context, start_at: float | None = None) -> str:
    """Create a child object (idempotent on its id), dormant until ``start_at`` if given;
    returns the child's agent version."""
    name = agent if isinstance(agent, str) else getattr(agent, "__perdure_agent__", None)
    definition = node.agents.get(str(name)) if name is not None else None
    if definition is None:
        raise UnknownAgentError(
            f"cannot delegate to {agent!r}: no such agent is registered on this node"
        )
    if needs_sealing(args, kwargs, seal_all=definition.encrypt):
        sealer = node.sealer(child_id, seal_all=definition.encrypt)
        args, kwargs = await node.write(
            lambda: sealed_arguments(sealer, args, kwargs, agent=definition.name))
    new = instantiate(definition, args, kwargs, object_id=child_id, signer=node.signer,
                      policy_ref=node.policy_ref, now=node.clock(), parent=parent,
                      start_at=start_at)
    if not await node.write(node.store.create, new, node.clock()):
        row = await node.read(node.store.get, child_id)
        if row is not None and (row.agent != definition.name
                                or row.parent_id != parent.object_id):
            # Not this parent's child (a replay re-creating its own child lands here
            # too, and goes on): waiting on it would wait forever.
            owner = (f"object {row.parent_id!r}" if row.parent_id is not None
                     else "no parent (it was started on its own)")
            raise ObjectConflictError(
                f"cannot delegate to {child_id!r}: that id belongs to an object of agent "
                f"{row.agent!r} whose parent is {owner}, not {parent.object_id!r}; give "
                "the child another object_id (or let perdure choose one)")
        if row is not None:
            return str(row.agent_version)
    return definition.version


def parent_signal(node: Node, records: list[Record], body: dict[str, Any]) -> Signal | None:
    """The terminal signal for this object's parent, written with its last record."""
    context = Context.from_body(records[0].body["context"])  # fixed at instantiation
    if context.parent_id is None:
        return None
    payload = {"child_id": context.object_id, "outcome": body.get("outcome")}
    if "result" in body:
        payload["result"] = body["result"]
    if "error" in body:
        payload["error"] = body["error"]
    data = encode(payload)
    dedupe = f"child:{context.object_id}"
    seal, _ = seal_event(node.signer.sign, node.signer.node_id, context.parent_id,
                         CHILD_EVENT, data, dedupe, os.urandom(12).hex())
    return Signal(context.parent_id, CHILD_EVENT, data, dedupe, seal)


async def fold_children(node: Node, journal: Journal, records: list[Record],
                        signals: list[Event]) -> list[Record]:
    """Delegation phase: write finished children's results into memory, consuming their
    signals, without running the agent (it runs once, when all it awaits are done)."""
    known = {str(r.body.get("child_id")) for r in records if r.kind == Kind.CHILD_FINISHED}
    drafts: list[RecordDraft] = []
    for event in signals:
        digest, refused = event_refusal(node, event)
        if refused is not None:
            drafts.append(refused)
            continue
        finished = child_finished_body(event.payload, event.event_id, digest)
        if finished is not None and finished.child_id not in known:
            known.add(finished.child_id)
            drafts.append(finished.draft())
    if not drafts:
        drafts.append(Progress({"ignored_child_signals": [e.event_id for e in signals]}
                               ).draft())
    return await journal.commit(drafts, phase=Phase.DELEGATION,
                                consume_event_ids=[e.event_id for e in signals])
