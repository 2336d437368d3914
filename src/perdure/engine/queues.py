"""A node's side of queues (``perdure.core.flow``): the store enforces every limit in
the claim itself (``Leases.claim``), so a node only declares its App's queues as it
starts, and wakes on objects' ends while it serves any (an end may free a slot)."""

from __future__ import annotations

import logging

from perdure.engine.node import Node

__all__ = ["declare_queues"]

log = logging.getLogger("perdure.worker")


def declare_queues(node: Node) -> None:
    """Keep the limits of the queues this node's App declares in the store (on the write
    thread); a declaration that changes a queue's limits is logged, with both."""
    for queue in node.settings.queues:
        before = node.store.declare_queue(queue, node.clock())
        if before is not None:
            log.warning("queue %r: limits changed from %s to %s (this node's declaration); "
                        "every node now claims by the new ones", queue.name,
                        before.limits(), queue.limits(),
                        extra={"action": "queue_limits_changed", "queue": queue.name})
