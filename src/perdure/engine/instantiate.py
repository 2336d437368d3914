"""Instantiation: an agent's intent and context sealed into an object's first record."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from perdure.core.bodies import Instantiated
from perdure.core.chain import Signer, seal
from perdure.core.codec import encode
from perdure.core.intent import Context, Intent
from perdure.core.records import GENESIS_HASH
from perdure.stores.base import NewObject

if TYPE_CHECKING:
    from perdure.engine.settings import AgentDef

__all__ = ["instantiate"]


def instantiate(
    definition: AgentDef,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    object_id: str,
    signer: Signer,
    policy_ref: str,
    now: float,
    deadline: float | None = None,
    max_failures: int | None = None,
    budget: dict[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    parent: Context | None = None,
    start_at: float | None = None,
) -> NewObject:
    """Build a new object: intent, context (with lineage from ``parent``), first record.

    ``deadline`` is seconds from ``now``, or from ``start_at`` (seconds since the epoch)
    when the object starts later: no node runs it before then. A child shares its
    parent's trace and root, one level deeper, and inherits its labels.
    """
    intent = Intent(
        agent=definition.name,
        version=definition.version,
        args=tuple(args),
        kwargs=dict(kwargs),
        deadline=(max(now, start_at or now) + deadline if deadline is not None else None),
        max_failures=max_failures,
        budget=budget,
        requires=tuple(sorted(definition.requires)),
        start_at=start_at if start_at is not None and start_at > now else None,
    )
    if parent is None:
        context = Context(object_id=object_id, trace_id=uuid.uuid4().hex, root_id=object_id,
                          labels=dict(labels or {}))
    else:
        context = Context(
            object_id=object_id,
            trace_id=parent.trace_id,
            parent_id=parent.object_id,
            root_id=parent.root_id or parent.object_id,
            depth=parent.depth + 1,
            tenant=parent.tenant,
            trust_scope=parent.trust_scope,
            labels={**parent.labels, **dict(labels or {})},
        )
    encode(intent.to_body(), what="agent arguments")
    first = seal(
        Instantiated(intent, context).draft(),
        object_id=object_id, seq=1, prev_hash=GENESIS_HASH, trace_id=context.trace_id,
        ts_us=int(now * 1_000_000), policy_ref=policy_ref, signer=signer,
    )
    return NewObject(object_id=object_id, agent=definition.name,
                     agent_version=definition.version, first=first,
                     ready_at=intent.start_at if intent.start_at is not None else now,
                     parent_id=context.parent_id, requires=intent.requires)
