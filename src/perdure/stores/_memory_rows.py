"""The in-memory store's tables, and its writes as the SQL stores' statements make them.

Rows hold what the SQL schema's columns hold (a hash as hex, a record as the columns
it is stored in); each write below is one of the SQLite store's statements done on
Python values, with the same conditions and the same columns set, so that a test
on the in-memory store means what it would on a file. Callers hold the store's lock.
"""

from __future__ import annotations

import builtins
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from perdure.core import flow
from perdure.core.chain import CommitSeal
from perdure.core.lifecycle import TERMINAL_STATUSES
from perdure.errors import CancelRequestedError, LeaseLostError
from perdure.stores._rows import notices_cancel, record_params
from perdure.stores.base import (
    Append,
    CheckpointRow,
    Claim,
    DataKeyRow,
    Event,
    NewObject,
    ObjectRow,
    QueueStats,
    Route,
)

__all__ = ["TERMINAL", "NodeRow", "Row", "StoredEvent", "Tables", "apply_one"]

TERMINAL = TERMINAL_STATUSES  # str values compare equal to their Status


def _time(value: float | None) -> float | None:
    """A time as a REAL column keeps it."""
    return None if value is None else float(value)


@dataclass(slots=True)
class Row:
    """An object's row, column for column (``objects`` in the SQL schema)."""

    object_id: str
    agent: str
    agent_version: str
    ready_at: float | None
    head_seq: int
    head_hash: str
    parent_id: str | None
    created_at: float
    updated_at: float
    requires: tuple[str, ...]
    order: int  # when it was created, for ties in a claim's order
    status: str = "ready"
    phase: str = "instantiated"
    epoch: int = 0
    lease_owner: str | None = None
    lease_expires: float | None = None
    waiting_event: str | None = None
    paused: bool = False
    cancel_requested: bool = False
    parked: bool = False
    note: str | None = None
    result: bytes | None = None
    avoid: builtins.list[str] = field(default_factory=builtins.list)
    crashes: int = 0
    crash_seq: int | None = None
    queue: str | None = None
    queue_key: str | None = None
    priority: int = 0
    started_at: float | None = None
    dedupe_key: str | None = None

    def value(self) -> ObjectRow:
        """The row as the store hands it out."""
        return ObjectRow(
            self.object_id, self.agent, self.agent_version, self.status, self.phase,
            self.epoch, self.lease_owner, self.lease_expires, self.ready_at,
            self.waiting_event, self.paused, self.cancel_requested, self.parked, self.note,
            self.head_seq, self.head_hash, self.result, self.parent_id, self.created_at,
            self.updated_at, self.requires, tuple(self.avoid))

    def due(self) -> float | None:
        """When the row can be claimed (``objects_due``): its ready time, or its lease
        expiry if later; ``None`` while it waits for an event or is paused (not cancelled)."""
        if self.ready_at is None or (self.paused and not self.cancel_requested):
            return None
        if self.lease_expires is not None and self.lease_expires > self.ready_at:
            return self.lease_expires
        return self.ready_at

    def claim(self) -> Claim:
        """The lease the row holds now, as ``claim`` and ``renew`` return it."""
        assert self.lease_expires is not None
        return Claim(self.object_id, self.epoch, self.lease_expires, self.cancel_requested,
                     self.paused, self.crashes)

    def runnable(self, now: float) -> bool:
        """Runnable now and not held: due, not paused (unless cancelled), lease free."""
        return not (self.ready_at is None or self.ready_at > now
                    or (self.paused and not self.cancel_requested)
                    or (self.lease_expires is not None and self.lease_expires > now))

    def serves(self, route: Route) -> bool:
        """Whether ``route`` can serve the object (any node may finish a cancel)."""
        return self.cancel_requested or (
            (route.serves is None or f"{self.agent}@{self.agent_version}" in route.serves)
            and all(name in route.capabilities for name in self.requires)
            and route.node_id not in self.avoid)

    def claimable(self, now: float, route: Route) -> bool:
        """``claim_candidates``: without a queue, runnable now, and ``route`` can serve it."""
        return self.queue is None and self.runnable(now) and self.serves(route)

    def held(self, now: float) -> bool:
        """Whether a live lease holds the row (a queue's slot, if it has a queue)."""
        return (self.lease_owner is not None and self.lease_expires is not None
                and self.lease_expires > now)

    def take(self, owner: str, now: float, lease_until: float) -> Claim:
        """``claim_one``: lease the row to ``owner``, bumping its epoch."""
        # A lease that lapsed instead of being let go: its worker died (or lost the
        # store) while it ran the object. Deaths at the same head count up; any other
        # claim resets.
        self.crashes = (0 if self.lease_owner is None
                        else self.crashes + 1 if self.crash_seq == self.head_seq else 1)
        self.crash_seq = self.head_seq
        self.epoch += 1
        self.lease_owner, self.lease_expires = owner, float(lease_until)
        self.status, self.phase, self.updated_at = "running", "evaluation", float(now)
        if self.queue is not None and self.started_at is None:
            self.started_at = float(now)
        return self.claim()


@dataclass(slots=True)
class StoredEvent:
    """An event in the inbox, and the record that consumed it (``None``: pending)."""

    event_id: int
    object_id: str
    name: str
    payload: bytes
    dedupe_key: str | None
    sent_at: float
    seal: bytes
    consumed_seq: int | None = None

    def value(self) -> Event:
        """The event as the store hands it out."""
        return Event(self.event_id, self.object_id, self.name, self.payload, self.dedupe_key,
                     self.sent_at, self.seal)


@dataclass(slots=True)
class NodeRow:
    """A registered node: its key, and what its last heartbeat said."""

    public_key: bytes
    created_at: float
    serves: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    seen_at: float | None = None
    live_until: float | None = None


@dataclass(slots=True)
class Tables:
    """Everything a memory store holds."""

    objects: dict[str, Row] = field(default_factory=dict)
    records: dict[str, dict[int, tuple[Any, ...]]] = field(default_factory=dict)  # by seq
    seals: dict[bytes, CommitSeal] = field(default_factory=dict)
    inbox: dict[str, dict[int, StoredEvent]] = field(default_factory=dict)  # by event id
    dedupe: set[tuple[str, str]] = field(default_factory=set)
    last_event: int = 0
    nodes: dict[str, NodeRow] = field(default_factory=dict)
    trust: dict[str, tuple[float, str, bytes]] = field(default_factory=dict)
    data_keys: dict[str, DataKeyRow] = field(default_factory=dict)
    checkpoints: dict[tuple[str, str], CheckpointRow] = field(default_factory=dict)
    queues: dict[str, flow.Queue] = field(default_factory=dict)
    # Alerts by (rule, subject): the row and the time it last changed.
    alerts: dict[tuple[str, str], tuple[Any, float]] = field(default_factory=dict)
    # Model quotas by (provider, model): the quota, its state and its window's
    # reservations by ticket, each [at, tokens, settled].
    quotas: dict[tuple[str, str], tuple[Any, Any]] = field(default_factory=dict)
    reservations: dict[int, tuple[tuple[str, str], builtins.list[Any]]] = field(
        default_factory=dict)
    last_ticket: int = 0
    woken: builtins.list[str] = field(default_factory=builtins.list)  # to tell subscribers
    # Due times (the SQL stores' objects_due index) as a heap of (due, order, object_id):
    # an entry is pushed whenever a write may change a row's due time, and is current
    # while the row still has that due time (older ones are dropped when they surface).
    due_heap: builtins.list[tuple[float, int, str]] = field(default_factory=builtins.list)

    def due_changed(self, row: Row) -> None:
        """Note ``row``'s due time after a write that may have changed it."""
        due = row.due()
        if due is not None:
            heapq.heappush(self.due_heap, (due, row.order, row.object_id))
            if len(self.due_heap) > 2 * len(self.objects) + 64:
                self.due_heap = [(d, r.order, r.object_id) for r in self.objects.values()
                                 if (d := r.due()) is not None]
                heapq.heapify(self.due_heap)

    def _current(self, entry: tuple[float, int, str]) -> Row | None:
        row = self.objects.get(entry[2])
        return row if row is not None and row.due() == entry[0] else None

    def next_due(self) -> float | None:
        """``next_ready_at``: the earliest due time (stale entries on top are dropped)."""
        heap = self.due_heap
        while heap:
            if self._current(heap[0]) is not None:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def due_by(self, now: float) -> builtins.list[Row]:
        """Rows due at ``now``: read off the top of the heap, which keeps them."""
        heap = self.due_heap
        kept: dict[str, tuple[float, int, str]] = {}
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if self._current(entry) is not None:
                kept[entry[2]] = entry
        for entry in kept.values():
            heapq.heappush(heap, entry)
        return [self.objects[oid] for oid in kept]

    def create(self, new: NewObject, now: float) -> bool:
        """``insert_object`` and ``insert_record``: ``False`` if the id is taken."""
        if new.object_id in self.objects:
            return False
        if new.dedupe_key is not None and new.queue is not None and self.holder(
                new.queue, new.dedupe_key) is not None:
            return False  # objects_dedupe
        now = float(now)
        self.objects[new.object_id] = Row(
            new.object_id, new.agent, new.agent_version, _time(new.ready_at), new.first.seq,
            new.first.hash, new.parent_id, now, now, tuple(sorted(new.requires)),
            len(self.objects), queue=new.queue, queue_key=new.queue_key,
            priority=new.priority, dedupe_key=new.dedupe_key)
        self.records.setdefault(new.object_id, {})[new.first.seq] = record_params(new.first)
        self.due_changed(self.objects[new.object_id])
        self.woken.append(new.object_id)
        return True

    def claim(self, owner: str, now: float, lease_until: float, limit: int, route: Route
              ) -> builtins.list[Claim]:
        """Each queue with a runnable object (``queues_ready``, by name) as far as its
        limits let (``claim_queue``), then ``claim_candidates`` (oldest ready first) and
        ``claim_one`` for each."""
        due = self.due_by(now)
        claims: builtins.list[Claim] = []
        for name in sorted({row.queue for row in due
                            if row.queue is not None and row.runnable(now)}):
            if len(claims) < limit:
                claims += self.claim_queue(name, owner, now, lease_until,
                                           limit - len(claims), route)
        rows = sorted((row for row in due if row.claimable(now, route)),
                      key=lambda row: (row.ready_at, row.order))
        for row in rows[:limit - len(claims)]:
            claims.append(row.take(owner, now, lease_until))
            self.due_changed(row)
        return claims

    def claim_queue(self, name: str, owner: str, now: float, lease_until: float, limit: int,
                    route: Route) -> builtins.list[Claim]:
        """What queue ``name`` has room for (``queue_held``, ``queue_candidates``,
        ``flow.admit``), leased."""
        queue = self.queues.get(name)
        if queue is None:
            return []
        mine = 0
        by_key: dict[str, int] = {}
        held = started = 0
        members = [row for row in self.objects.values() if row.queue == name]
        for row in members:
            if row.held(now):
                held += 1
                mine += row.lease_owner == owner
                if row.queue_key is not None:
                    by_key[row.queue_key] = by_key.get(row.queue_key, 0) + 1
            if (queue.rate_period is not None and row.started_at is not None
                    and row.started_at > now - queue.rate_period):
                started += 1
        load = flow.QueueLoad(held, mine, by_key, started)
        ready = sorted((row for row in members if row.runnable(now) and row.serves(route)),
                       key=lambda row: (not row.cancel_requested, row.priority,
                                        row.ready_at, row.object_id))
        found = [flow.Candidate(row.object_id, row.queue_key, row.started_at is None,
                                row.cancel_requested) for row in ready]
        claims = []
        for object_id in flow.admit(queue, load, found, limit):
            row = self.objects[object_id]
            claims.append(row.take(owner, now, lease_until))
            self.due_changed(row)
        return claims

    def holder(self, queue: str, dedupe_key: str) -> str | None:
        """``queue_holder``: the live object of ``queue`` holding ``dedupe_key``."""
        for row in self.objects.values():
            if (row.queue == queue and row.dedupe_key == dedupe_key
                    and row.status not in TERMINAL):
                return row.object_id
        return None

    def queue_stats(self, now: float) -> builtins.list[QueueStats]:
        """``queue_stats``: each queue, its slots held, runnable and dormant objects."""
        stats = []
        for name, queue in sorted(self.queues.items()):
            held = ready = waiting = started = 0
            for row in self.objects.values():
                if row.queue != name:
                    continue
                if (queue.rate_period is not None and row.started_at is not None
                        and row.started_at > now - queue.rate_period):
                    started += 1
                if row.status in TERMINAL:
                    continue
                if row.held(now):
                    held += 1
                elif (row.ready_at is not None and row.ready_at <= now
                      and not (row.paused and not row.cancel_requested)):
                    ready += 1
                else:
                    waiting += 1
            stats.append(QueueStats(queue, held, ready, waiting, started))
        return stats

    def insert_event(self, object_id: str, name: str, payload: bytes, dedupe_key: str | None,
                     now: float, seal: bytes) -> bool:
        """``insert_event``: ``False`` (nothing queued) for a ``dedupe_key`` seen before."""
        if dedupe_key is not None:
            if (object_id, dedupe_key) in self.dedupe:
                return False
            self.dedupe.add((object_id, dedupe_key))
        self.last_event += 1
        self.inbox.setdefault(object_id, {})[self.last_event] = StoredEvent(
            self.last_event, object_id, name, bytes(payload), dedupe_key, float(now),
            bytes(seal))
        return True

    def wake_for_event(self, object_id: str, name: str, now: float) -> None:
        """``wake_for_event``: a released object waiting for ``name`` is runnable now; so
        is any released object for a control event (a name starting with ``perdure:``)."""
        row = self.objects.get(object_id)
        if (row is not None and row.lease_owner is None
                and (row.waiting_event == name or name.startswith("perdure:"))
                and (row.ready_at is None or row.ready_at > now)
                and row.status not in TERMINAL):
            row.ready_at = float(now)
            self.due_changed(row)

    def pending(self, object_id: str, name: str, consuming: Sequence[int] = ()) -> bool:
        """Whether an event named ``name`` (or an update request, which a wait for an
        event of the agent's own takes, not perdure's own waits) waits in the object's
        inbox, beside the ones the append at hand consumes (``consuming``)."""
        names = (name,) if name.startswith("perdure:") else (name, "perdure:update")
        return any(event.name in names and event.consumed_seq is None
                   and event_id not in consuming
                   for event_id, event in self.inbox.get(object_id, {}).items())

    def cancel_children(self, parent_id: str, now: float) -> None:
        """``cancel_children``: a parent that terminates asks its live children to cancel."""
        for row in self.objects.values():
            if row.parent_id == parent_id and row.status not in TERMINAL:
                row.cancel_requested, row.updated_at = True, now
                row.ready_at = now if row.ready_at is None else min(row.ready_at, now)
                self.due_changed(row)
                self.woken.append(row.object_id)


def _refusal(t: Tables, op: Append, records: Sequence[tuple[Any, ...]]
             ) -> BaseException | None:
    """Why ``op`` writes nothing (``append_update``'s fence, a record conflict, an event
    consumed already), or ``None`` when it goes through."""
    row = t.objects.get(op.object_id)
    expected = op.records[0].seq - 1 if op.records else None
    if (row is None or row.epoch != op.epoch
            or (expected is not None and row.head_seq != expected)
            # Nothing is appended to memory that holds its terminal record.
            or (op.records and row.status in TERMINAL)
            # A completion is refused while a cancel is pending: the node writes the cancel.
            or (op.unless_cancelled and row.cancel_requested)):
        if (op.unless_cancelled and row is not None and row.epoch == op.epoch
                and row.cancel_requested):
            return CancelRequestedError(f"object {op.object_id!r}: a cancel was requested; "
                                        "the completion was not written")
        return LeaseLostError(
            f"object {op.object_id!r}: epoch {op.epoch} no longer holds the lease "
            "(another node took it over); this node stops touching it")
    stored = t.records.get(op.object_id, {})
    seqs = [rec[1] for rec in records]
    if len(set(seqs)) != len(seqs) or any(seq in stored for seq in seqs):
        return LeaseLostError(f"object {op.object_id!r}: another node appended first")
    inbox = t.inbox.get(op.object_id, {})
    seen: set[int] = set()
    for event_id in op.consume_event_ids:
        assert op.records, "consuming an event needs the record that receives it"
        event = inbox.get(event_id)
        if event is None or event.consumed_seq is not None or event_id in seen:
            return LeaseLostError(
                f"object {op.object_id!r}: event {event_id} was consumed by another node")
        seen.add(event_id)
    return None


def apply_one(t: Tables, op: Append, now: float, records: Sequence[tuple[Any, ...]]
              ) -> BaseException | None:
    """Apply one fenced append (``records``: its records' stored columns) as the SQLite
    store's ``_apply_one`` does, or write nothing; its outcome."""
    refused = _refusal(t, op, records)
    if refused is not None:
        return refused
    row = t.objects[op.object_id]
    if row.cancel_requested and op.status not in TERMINAL:
        # A cancel asked for while the node ran must not be lost when it lets go.
        row.ready_at = now
    elif op.waiting_event is not None and t.pending(op.object_id, op.waiting_event,
                                                    op.consume_event_ids):
        row.ready_at = now
    else:
        row.ready_at = _time(op.ready_at)
    if op.records:
        row.head_seq, row.head_hash = op.records[-1].seq, op.records[-1].hash
    row.status, row.phase, row.waiting_event = op.status, op.phase, op.waiting_event
    if op.result is not None:
        row.result = bytes(op.result)
    if op.release:
        row.lease_owner = row.lease_expires = None
    row.parked, row.note, row.updated_at = op.parked, op.note, now
    if op.requires is not None:
        row.requires = tuple(sorted(op.requires))
    if op.clear_avoid:
        row.avoid = []
    elif op.avoid_node is not None:
        row.avoid = [*row.avoid, op.avoid_node]
    t.due_changed(row)
    cancel = row.cancel_requested and notices_cancel(op)
    stored = t.records.setdefault(op.object_id, {})
    for rec in records:
        stored[rec[1]] = rec
    inbox = t.inbox.get(op.object_id, {})
    for event_id in op.consume_event_ids:
        inbox[event_id].consumed_seq = op.records[-1].seq
    if op.signal is not None:
        sig = op.signal
        t.insert_event(sig.object_id, sig.name, sig.payload, sig.dedupe_key, now, sig.seal)
        t.wake_for_event(sig.object_id, sig.name, now)
        t.woken.append(sig.object_id)
    if op.cancel_children:
        t.cancel_children(op.object_id, now)
    if op.release and row.ready_at is not None:  # runnable now, or a new due time
        t.woken.append(op.object_id)
    if cancel:
        return CancelRequestedError(f"object {op.object_id!r}: a cancel was requested")
    return None
