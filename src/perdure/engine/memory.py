"""Reading an object's memory and inbox for a claim, and vouching for what was read.

No code runs on memory this node cannot vouch for: the chain's links and hashes are
checked up to the head the object's row names, its newest record must be signed by a
key certified under a root this node trusts (it chains every record before it), and
the chain must reach the highest head this node saw of the object (rollback). The
records this node holds (``HeldRecords``) spare reading and checking them again.
Events from the inbox are checked against their senders' seals; one that fails is
refused with a record saying why.
"""

from __future__ import annotations

import logging
import time

from perdure.core.bodies import EventRefused
from perdure.core.records import Record, RecordDraft
from perdure.engine.node import Node
from perdure.errors import IntegrityError, RecordDecodeError
from perdure.hooks import ObjectClaimed
from perdure.stores.base import CheckpointRow, Event, ObjectRow

__all__ = ["checked_memory", "event_refusal", "pending_events"]

log = logging.getLogger("perdure.worker")


async def checked_memory(node: Node, oid: str, epoch: int = 0
                         ) -> tuple[list[Record], ObjectRow | None, list[Event]]:
    """The object's whole chain, vouched for, its row and its pending events.

    Links and hashes are checked up to the head the row records; the newest record's
    signature (or commit seal) must verify under a key certified by a root this node
    trusts (it chains every record before it); and the chain must reach the highest
    head this node saw of the object. Reads only the tail when this node holds the
    earlier records; falls back to the full chain if the tail does not fit on.
    Raises ``IntegrityError`` or ``RecordDecodeError`` when the stored chain cannot
    be vouched for.

    All of it is read and checked in one trip to a read thread: a claim pays one hop
    there and back, not one per read.
    """
    began = time.perf_counter()
    held = node.held.get(oid)
    records, row, events, slots, read, dropped = await node.read(_read_vouched, node, oid,
                                                                 held)
    node.slots.primed[oid] = slots
    if dropped is not None:
        log.info("%s: held records do not fit the store (%s); reading the whole chain",
                 oid, dropped, extra={"action": "held_records_dropped"})
    node.held.put(oid, records)
    if node.hooks.active:
        node.hooks.emit(ObjectClaimed(node.signer.node_id, oid, epoch, read,
                                      held is not None and dropped is None,
                                      time.perf_counter() - began,
                                      records[0].trace_id if records else ""))
    return records, row, events


def _read_vouched(node: Node, oid: str, held: list[Record] | None
                  ) -> tuple[list[Record], ObjectRow | None, list[Event],
                             list[CheckpointRow], int, BaseException | None]:
    """On a read thread: the vouched chain (from ``held`` on, when it fits), the row,
    the pending events, the checkpoint slot rows (verified when the agent runs), how
    many records were read, and why ``held`` did not fit."""
    dropped: BaseException | None = None
    if held is not None:
        last = held[-1]
        try:
            tail: list[Record] = node.store.chain(oid, last.seq, last.hash)
            records: list[Record] = held + tail
            row = _vouch(node, oid, records, len(held))
        except (IntegrityError, RecordDecodeError) as exc:
            dropped = exc
        else:
            return (records, row, pending_events(node, oid), node.store.checkpoints(oid),
                    len(tail), None)
    records = node.store.chain(oid)
    if not records:
        raise IntegrityError(oid, 1, "object has no records")
    row = _vouch(node, oid, records, 0)
    return (records, row, pending_events(node, oid), node.store.checkpoints(oid),
            len(records), dropped)


def _vouch(node: Node, oid: str, records: list[Record], known: int) -> ObjectRow | None:
    """On a read thread: the row must name the chain's head, the chain must reach
    what this node saw, and its newest record must be signed by a trusted key
    (unless this node already holds it: the first ``known`` records, or the head it
    saw itself). Returns the row."""
    row = _head_of(node, oid, records)
    last = records[-1]
    rolled, seen = node.anchors.seen(oid, records)
    if rolled is not None:
        raise IntegrityError(oid, *rolled)
    if len(records) > known and not (seen is not None and seen[1] == last.seq
                                     and seen[2] == last.hash):
        node.verifier.check_head(oid, records)
        node.anchors.note(oid, records[0].hash, last.seq, last.hash)
    return row


def _head_of(node: Node, oid: str, records: list[Record]) -> ObjectRow | None:
    """The chain must end where the object's row (returned) says its head is."""
    head: ObjectRow | None = node.store.get(oid)
    last = records[-1]
    if head is not None and head.head_seq != last.seq:
        raise IntegrityError(oid, last.seq + 1, f"chain ends at #{last.seq} but the "
                             f"object's head is #{head.head_seq} (records missing)")
    if head is not None and head.head_hash != last.hash:
        raise IntegrityError(oid, last.seq, "last record's hash differs from the "
                             "object's recorded head")
    return head


def pending_events(node: Node, oid: str) -> list[Event]:
    """On a read thread: the object's pending events, their senders looked up."""
    events = node.store.pending_events(oid)
    if events:
        node.verifier.warm(events)
    return events


def event_refusal(node: Node, event: Event) -> tuple[str | None, RecordDraft | None]:
    """The digest of ``event`` if its seal verifies, or a refusal record for it."""
    digest, problem = node.verifier.check_event(event)
    if problem is None:
        return digest, None
    log.error("refused event %r #%d for %s: %s", event.name, event.event_id,
              event.object_id, problem,
              extra={"action": "integrity_failure", "object_id": event.object_id})
    return digest, EventRefused(event.event_id, event.name, digest, problem).draft()
