"""Refining a lineage budget's owner wakes the descendants it stopped.

A descendant whose model call would pass a lineage budget goes dormant with the note
``budget exhausted: ... (the lineage budget of <owner>)`` until a refinement. When the
owner's budget is refined (its refinement folded into its memory, so that any reader of
the lineage now sees the new budget), the node that folded it sends each descendant
dormant on that owner's budget a refinement of its own with no changes, sealed by the
node: an ``intent_refined`` record in the descendant's memory ends its budget dormancy,
and it tries its call again against the new budget (going dormant again, recorded, if
the call still does not fit). Descendants stopped by their own budget or another
ancestor's are left alone.
"""

from __future__ import annotations

import os

from perdure.core.codec import encode
from perdure.core.events import REFINE_EVENT
from perdure.core.lifecycle import Status
from perdure.core.trust import seal_event
from perdure.engine.node import Node
from perdure.stores.base import Store

__all__ = ["stopped_by", "wake_stopped"]

_MAX_DESCENDANTS = 10_000  # how many descendants one refinement looks at, at most


def stopped_by(store: Store, owner: str) -> list[str]:
    """The ids of ``owner``'s descendants dormant on its lineage budget (blocking)."""
    mark = f"(the lineage budget of {owner})"
    found: list[str] = []
    seen = 0
    parents = [owner]
    while parents and seen < _MAX_DESCENDANTS:
        parent = parents.pop()
        for row in store.list(parent=parent, limit=_MAX_DESCENDANTS):
            seen += 1
            parents.append(row.object_id)
            if row.status == Status.DORMANT and row.note and mark in row.note:
                found.append(row.object_id)
    return found


async def wake_stopped(node: Node, owner: str) -> list[str]:
    """Send each descendant ``owner``'s lineage budget stopped an empty refinement (see
    the module); the ids woken."""
    woken: list[str] = await node.read(stopped_by, node.store, owner)
    data = encode({})
    for oid in woken:
        seal, _ = seal_event(node.signer.sign, node.signer.node_id, oid, REFINE_EVENT,
                             data, None, os.urandom(12).hex())
        await node.write(node.store.send, oid, REFINE_EVENT, data, None, node.clock(), seal)
    return woken
