"""In-memory store: the whole ``Store`` contract in this process's memory, for tests.

``open_store("memory:")`` (or ``memory://NAME``, the name a label shown in banners)
gives a new, empty store each time; two Apps share one by being given the same
``MemoryStore`` object. Nothing is persisted: the store lives as long as the object,
and ``close`` drops its contents. It keeps every promise the SQL stores keep (fenced
appends, leases and epochs, the inbox, signals, cancel flags, commit seals, trust
items, heartbeats) under one lock, so that a worker's threads can share it, and pushes
wake-ups, ends and changes to its subscribers (all in this process, as its users are).
Leases and timers are judged by the ``now`` a node passes, as on SQLite.

The rows live in ``_memory_rows``, the dashboard's reads in ``_memory_browse``; this
module is the store's roles.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from perdure.core.chain import CommitSeal
from perdure.core.events import APPROVAL_EVENT
from perdure.core.flow import Queue
from perdure.core.quotas import ModelQuota, QuotaState, Reservation, admit, factor_at, throttled
from perdure.core.records import GENESIS_HASH, Record
from perdure.errors import (
    ObjectNotFoundError,
    ObjectTerminatedError,
    StoreError,
)
from perdure.stores import _memory_browse as browsing
from perdure.stores._memory_rows import TERMINAL, NodeRow, Tables, apply_one
from perdure.stores._push import CHANGED, ENDED, WAKE, Hub, pushes
from perdure.stores._rows import checked_chain, record_from_row, record_params
from perdure.stores.base import (
    AlertRow,
    Append,
    CheckpointRow,
    Claim,
    DataKeyRow,
    Event,
    NewObject,
    NodeInfo,
    ObjectCount,
    ObjectFilter,
    ObjectRow,
    Outcomes,
    QueueStats,
    QuotaGrant,
    QuotaStats,
    RecordBody,
    Route,
    Writer,
)
from perdure.stores.writers import InlineWriter

__all__ = ["MemoryStore"]

log = logging.getLogger("perdure.store")


class MemoryStore:
    """A ``Store`` in this process's memory, shared by every thread that holds it.

    For tests and trying things out: nothing survives the object (see the module).
    """

    def __init__(self, url: str = "memory:") -> None:
        self.url = url
        self._lock = threading.Lock()
        self._tables: Tables | None = Tables()
        self._hub = Hub()

    # -- the lock, and wake-ups ----------------------------------------------------

    @contextlib.contextmanager
    def _held(self, *, wait: bool = True) -> Iterator[Tables]:
        """The tables, under the store's lock; ``StoreError`` once the store is closed.
        Wake-ups noted meanwhile go out once the lock is let go."""
        if not self._lock.acquire(blocking=wait):
            raise _Busy
        try:
            tables = self._tables
            if tables is None:
                raise StoreError(f"store {self.url} is closed; open a new one")
            yield tables
            woken, tables.woken = tables.woken, []
        finally:
            self._lock.release()
        if woken:
            self._hub.deliver(WAKE, woken)

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(object_id)`` whenever an object may have become runnable or its
        due time changed (on the thread that made it so); returns ``stop``."""
        return self._hub.add((WAKE,), callback)

    def subscribe_results(self, callback: Callable[[str], None], *,
                          object_id: str | None = None, changes: bool = False
                          ) -> Callable[[], None]:
        """Call ``callback(object_id)`` when an object (``object_id`` only, if given) ended
        or was parked, and with ``changes`` whenever records were committed to it (on the
        committing thread); returns ``stop``."""
        return self._hub.add((ENDED, CHANGED) if changes else (ENDED,), callback, object_id)

    def _tell_commit(self, ops: Sequence[Append], outcomes: Outcomes) -> None:
        """Push what a group commit tells to whoever wants it, beyond the wake-ups the
        tables noted."""
        wanted = self._hub.kinds() - {WAKE}
        if wanted:
            self._hub.deliver_all(pushes(ops, outcomes, wanted))

    def close(self) -> None:
        """Drop everything: the store cannot be used afterwards."""
        with self._lock:
            self._tables = None
        self._hub.clear()

    # -- nodes ---------------------------------------------------------------------

    def publish_trust(self, item_id: str, kind: str, body: bytes, now: float) -> None:
        """Keep a trust item (certificate or revocation) under ``item_id``, once."""
        with self._held() as t:
            t.trust.setdefault(item_id, (float(now), kind, bytes(body)))

    def trust_items(self) -> builtins.list[tuple[str, bytes]]:
        """Every trust item as ``(kind, body)``, oldest first."""
        with self._held() as t:
            items = sorted((created, item_id, kind, body)
                           for item_id, (created, kind, body) in t.trust.items())
        return [(kind, body) for _, _, kind, body in items]

    # -- data keys ----------------------------------------------------------------

    def data_key(self, object_id: str) -> DataKeyRow | None:
        """The object's wrapped data key, if it has one."""
        with self._held() as t:
            return t.data_keys.get(object_id)

    def put_data_key(self, row: DataKeyRow, now: float) -> DataKeyRow:
        """Keep ``row`` unless the object has a data key already; the row kept."""
        with self._held() as t:
            return t.data_keys.setdefault(row.object_id, row)

    def data_keys_not_under(self, key_id: str, after: str, limit: int
                            ) -> builtins.list[DataKeyRow]:
        """Up to ``limit`` data keys wrapped under another key than ``key_id``."""
        with self._held() as t:
            rows = sorted((r for r in t.data_keys.values()
                           if r.key_id != key_id and r.object_id > after),
                          key=lambda r: r.object_id)
        return rows[:limit]

    def rewrap_data_key(self, old: DataKeyRow, key_id: str, wrapped: bytes,
                        now: float) -> bool:
        """Replace ``old`` by ``wrapped`` under ``key_id`` if the row is still ``old``."""
        with self._held() as t:
            if t.data_keys.get(old.object_id) != old:
                return False
            t.data_keys[old.object_id] = DataKeyRow(old.object_id, key_id, bytes(wrapped),
                                                    old.seal_all)
            return True

    # -- checkpoint slots ---------------------------------------------------------

    def put_checkpoint(self, row: CheckpointRow) -> bool:
        """Upsert ``row`` if the object's lease is still at ``row.epoch``."""
        with self._held() as t:
            obj = t.objects.get(row.object_id)
            if obj is None or obj.epoch != row.epoch or obj.lease_owner is None:
                return False
            t.checkpoints[(row.object_id, row.slot)] = row
            return True

    def checkpoints(self, object_id: str) -> builtins.list[CheckpointRow]:
        """Every slot row of ``object_id``, by slot."""
        with self._held() as t:
            return sorted((r for (oid, _), r in t.checkpoints.items() if oid == object_id),
                          key=lambda r: r.slot)

    def delete_checkpoints(self, object_id: str, slots: Sequence[str] | None,
                           epoch: int | None) -> bool:
        """Delete ``slots`` (``None``: all) of ``object_id``, fenced on ``epoch``."""
        with self._held() as t:
            obj = t.objects.get(object_id)
            if epoch is not None and (obj is None or obj.epoch != epoch
                                      or obj.lease_owner is None):
                return False
            gone = ([key for key in t.checkpoints if key[0] == object_id] if slots is None
                    else [(object_id, s) for s in slots])
            for key in gone:
                t.checkpoints.pop(key, None)
            return True

    def data_key_counts(self) -> dict[str, int]:
        """How many data keys each key-encryption key id wraps."""
        counts: dict[str, int] = {}
        with self._held() as t:
            for row in t.data_keys.values():
                counts[row.key_id] = counts.get(row.key_id, 0) + 1
        return dict(sorted(counts.items()))

    def heartbeat(self, node_id: str, public_key: bytes, serves: Sequence[str],
                  capabilities: Sequence[str], now: float, live_until: float) -> None:
        """Record that ``node_id`` is alive until ``live_until``, what it serves and can do."""
        with self._held() as t:
            node = t.nodes.get(node_id)
            if node is None:
                node = t.nodes[node_id] = NodeRow(bytes(public_key), float(now))
            node.public_key = bytes(public_key)
            node.serves, node.capabilities = tuple(sorted(serves)), tuple(sorted(capabilities))
            node.seen_at, node.live_until = float(now), float(live_until)

    def node_gone(self, node_id: str, now: float) -> None:
        """Record that ``node_id`` stopped: it no longer counts as live."""
        with self._held() as t:
            node = t.nodes.get(node_id)
            if node is not None and node.live_until is not None and node.live_until > now:
                node.live_until = float(now)

    def live_nodes(self, now: float) -> builtins.list[NodeInfo]:
        """Nodes live at ``now``."""
        with self._held() as t:
            return [NodeInfo(node_id, node.serves, node.capabilities, node.seen_at,
                             node.live_until)
                    for node_id, node in sorted(t.nodes.items())
                    if node.seen_at is not None and node.live_until is not None
                    and node.live_until > now]

    # -- objects and records -------------------------------------------------------

    def create(self, new: NewObject, now: float) -> bool:
        """Insert the object row and its first record, together."""
        with self._held() as t:
            return t.create(new, now)

    def get(self, object_id: str) -> ObjectRow | None:
        """The object's row, or ``None``."""
        with self._held() as t:
            row = t.objects.get(object_id)
            return None if row is None else row.value()

    def list(
        self,
        *,
        status: str | None = None,
        phase: str | None = None,
        agent: str | None = None,
        parent: str | None = None,
        limit: int = 100,
    ) -> builtins.list[ObjectRow]:
        """Rows matching the filters, newest first."""
        with self._held() as t:
            rows = [row for row in t.objects.values()
                    if (status is None or row.status == status)
                    and (phase is None or row.phase == phase)
                    and (agent is None or row.agent == agent)
                    and (parent is None or row.parent_id == parent)]
            rows.sort(key=lambda row: row.object_id)
            rows.sort(key=lambda row: row.created_at, reverse=True)
            return [row.value() for row in (rows if limit < 0 else rows[:limit])]

    def records(self, object_id: str, after_seq: int = 0) -> builtins.list[Record]:
        """Records after ``after_seq``, decoded from their stored columns."""
        with self._held() as t:
            # Written in seq order (each append follows the head), so kept in it.
            rows = [row for seq, row in t.records.get(object_id, {}).items() if seq > after_seq]
        return [record_from_row(row) for row in rows]

    def record(self, object_id: str, seq: int) -> Record | None:
        """The object's record ``seq``, decoded from its stored columns, or ``None``."""
        with self._held() as t:
            row = t.records.get(object_id, {}).get(seq)
        return None if row is None else record_from_row(row)

    def chain(self, object_id: str, after_seq: int = 0, start_hash: str = GENESIS_HASH
              ) -> builtins.list[Record]:
        """Records after ``after_seq``, links and hashes checked from ``start_hash``."""
        return checked_chain(object_id, None, after_seq, start_hash,
                             lambda: self.records(object_id, after_seq))

    def seals(self, digests: Sequence[bytes]) -> dict[bytes, CommitSeal]:
        """The stored commit seals among ``digests``, by digest."""
        with self._held() as t:
            return {digest: t.seals[digest] for digest in digests if digest in t.seals}

    # -- browsing ----------------------------------------------------------------------

    def browse(self, where: ObjectFilter, *, after: tuple[float, str] | None = None,
               limit: int = 50, now: float) -> builtins.list[ObjectRow]:
        """Rows matching ``where``, newest first, a page after the key ``after``."""
        with self._held() as t:
            return browsing.browse(t, where, after, limit, float(now))

    def records_of_kinds(self, object_id: str, kinds: Sequence[str], limit: int
                         ) -> builtins.list[Record]:
        """The object's records of ``kinds``, oldest first, at most ``limit``."""
        with self._held() as t:
            rows = browsing.records_of_kinds(t, object_id, kinds, limit)
        return [record_from_row(row) for row in rows]

    def status_counts(self) -> dict[str, int]:
        """How many objects hold each stored status."""
        counts: dict[str, int] = {}
        with self._held() as t:
            for row in t.objects.values():
                counts[row.status] = counts.get(row.status, 0) + 1
        return counts

    def object_counts(self) -> builtins.list[ObjectCount]:
        """Objects per agent and shown status, and those waiting for an approval."""
        groups: dict[tuple[str, str], list[int]] = {}
        with self._held() as t:
            for row in t.objects.values():
                shown = "parked" if row.parked else "paused" if row.paused else row.status
                group = groups.setdefault((row.agent, shown), [0, 0])
                group[0] += 1
                group[1] += row.waiting_event == APPROVAL_EVENT
        return [ObjectCount(agent, shown, count, approvals)
                for (agent, shown), (count, approvals) in groups.items()]

    def awaiting_outside(self, limit: int) -> builtins.list[ObjectRow]:
        """Dormant objects waiting for an event from outside, latest updated first."""
        with self._held() as t:
            return browsing.awaiting_outside(t, limit)

    def lease_holders(self, now: float, limit: int) -> builtins.list[tuple[str, str]]:
        """``(object_id, lease_owner)`` of leases live at ``now``, by id."""
        with self._held() as t:
            return browsing.lease_holders(t, now, limit)

    def queue_key_holders(self, queue: str, now: float, limit: int
                          ) -> builtins.list[tuple[str | None, int]]:
        """The keys of ``queue`` holding slots at ``now``, most first."""
        with self._held() as t:
            return browsing.queue_key_holders(t, queue, now, limit)

    def ended_since(self, since: float) -> builtins.list[tuple[str, float]]:
        """``(status, updated_at)`` of objects that ended at or after ``since``."""
        with self._held() as t:
            return browsing.ended_since(t, since)

    def updated_since(self, since: float, limit: int) -> builtins.list[str]:
        """Ids of objects updated at or after ``since``, latest first."""
        with self._held() as t:
            return browsing.updated_since(t, since, limit)

    def bodies_since(self, object_ids: Sequence[str], kinds: Sequence[str], since_us: int
                     ) -> builtins.list[RecordBody]:
        """Records of ``object_ids`` and ``kinds`` since ``since_us``, bodies as bytes."""
        with self._held() as t:
            return browsing.bodies_since(t, object_ids, kinds, since_us)

    def sent_at(self, event_ids: Sequence[int]) -> dict[int, float]:
        """When each of ``event_ids`` was sent."""
        with self._held() as t:
            return browsing.sent_at(t, event_ids)

    # -- leases ----------------------------------------------------------------------

    def claim(self, owner: str, now: float, lease_until: float, limit: int,
              route: Route | None = None) -> builtins.list[Claim]:
        """Lease up to ``limit`` runnable objects ``route`` can serve, oldest first."""
        if limit <= 0:
            return []
        with self._held() as t:
            return t.claim(owner, now, lease_until, limit, route or Route())

    # -- queues ----------------------------------------------------------------------

    def declare_queue(self, queue: Queue, now: float) -> Queue | None:
        """Keep ``queue``'s limits; those it replaced, if they differed."""
        with self._held() as t:
            before = t.queues.get(queue.name)
            t.queues[queue.name] = queue
        return None if before is None or before.same_limits(queue) else before

    def queues(self) -> builtins.list[Queue]:
        """Every declared queue, by name."""
        with self._held() as t:
            return [queue for _, queue in sorted(t.queues.items())]

    def queue_stats(self, now: float) -> builtins.list[QueueStats]:
        """Every declared queue and what it holds at ``now``."""
        with self._held() as t:
            return t.queue_stats(float(now))

    def queue_holder(self, queue: str, dedupe_key: str) -> str | None:
        """The live object of ``queue`` holding ``dedupe_key``, if any."""
        with self._held() as t:
            return t.holder(queue, dedupe_key)

    def debounce_start(self, object_id: str, dedupe_key: str, name: str, payload: bytes,
                       seal: bytes, ready_at: float, now: float) -> bool:
        """Queue ``name`` for an object not claimed yet and put its first claim off."""
        with self._held() as t:
            row = t.objects.get(object_id)
            if row is None or row.status in TERMINAL or row.dedupe_key != dedupe_key:
                return False
            if row.started_at is not None:  # it started: the key goes free
                row.dedupe_key = None
                return False
            t.insert_event(object_id, name, payload, None, now, seal)
            if not row.cancel_requested:
                row.ready_at, row.updated_at = float(ready_at), float(now)
                t.due_changed(row)
            return True

    # -- alerts ---------------------------------------------------------------------

    def fire_alert(self, rule: str, subject: str, summary: str, node_id: str,
                   now: float) -> bool:
        """Fire ``(rule, subject)`` unless firing; whether this call did."""
        with self._held() as t:
            known = t.alerts.get((rule, subject))
            if known is not None and known[0].state == "firing":
                return False
            t.alerts[(rule, subject)] = (AlertRow(rule, subject, "firing", summary, node_id,
                                                  now), now)
            return True

    def resolve_alert(self, rule: str, subject: str, now: float) -> AlertRow | None:
        """Resolve ``(rule, subject)`` if firing; the row this call resolved."""
        with self._held() as t:
            known = t.alerts.get((rule, subject))
            if known is None or known[0].state != "firing":
                return None
            row: AlertRow = known[0]
            t.alerts[(rule, subject)] = (dataclasses.replace(
                row, state="resolved", resolved_at=now), now)
            return dataclasses.replace(row, resolved_at=now)

    def alerts(self, *, state: str | None = None, rule_prefix: str = "",
               limit: int = 100) -> builtins.list[AlertRow]:
        """Alerts, latest changed first."""
        with self._held() as t:
            found = [(changed, row) for row, changed in t.alerts.values()
                     if (state is None or row.state == state)
                     and row.rule.startswith(rule_prefix)]
        found.sort(key=lambda item: (-item[0], item[1].rule, item[1].subject))
        return [row for _, row in found[:limit]]

    # -- model quotas ---------------------------------------------------------------

    def declare_model_quota(self, quota: ModelQuota, now: float) -> ModelQuota | None:
        """Keep ``quota``'s limits; those it replaced, if they differed."""
        with self._held() as t:
            known = t.quotas.get(quota.key)
            t.quotas[quota.key] = (quota, QuotaState() if known is None else known[1])
        before = None if known is None else known[0]
        return None if before is None or before.same_limits(quota) else before

    def model_quotas(self) -> builtins.list[ModelQuota]:
        """Every declared quota, by provider and model."""
        with self._held() as t:
            return [quota for _, (quota, _) in sorted(t.quotas.items())]

    @staticmethod
    def _window(t: Tables, key: tuple[str, str], since: float, now: float
                ) -> builtins.list[Any]:
        """The reservations of quota ``key`` in its window as ``[at, tokens, settled]``
        (a call in flight past its time, its object's lease live, as made ``now``; the
        others that left it dropped)."""
        found = []
        for ticket, (of, row) in list(t.reservations.items()):
            if of != key:
                continue
            if row[0] > since:
                found.append(row[:3])
                continue
            held = t.objects.get(row[3])
            if not row[2] and held is not None and held.held(now):
                found.append([now, row[1], False])
            else:
                del t.reservations[ticket]
        return found

    def reserve_quota(self, provider: str, model: str, tokens: int, object_id: str,
                      holder: str, now: float) -> QuotaGrant:
        """Reserve if the call fits the quota's window."""
        with self._held() as t:
            known = t.quotas.get((provider, model))
            if known is None:
                return QuotaGrant(True)
            quota, state = known
            window = self._window(t, quota.key, now - quota.window, now)
            ready = admit(quota, state, [Reservation(at, n) for at, n, _ in window], tokens,
                          now)
            if ready is not None:
                return QuotaGrant(False, None, ready)
            t.last_ticket += 1
            t.reservations[t.last_ticket] = (quota.key, [now, tokens, False, object_id])
            return QuotaGrant(True, t.last_ticket)

    def settle_quota(self, ticket: int, tokens: int, now: float) -> None:
        """Settle reservation ``ticket`` to ``tokens``."""
        with self._held() as t:
            found = t.reservations.get(ticket)
            if found is not None:
                row = found[1]
                row[:3] = [max(row[0], now), tokens, True]

    def quota_throttled(self, provider: str, model: str, retry_after: float | None,
                        now: float) -> QuotaState | None:
        """Adapt the quota after a 429."""
        with self._held() as t:
            known = t.quotas.get((provider, model))
            if known is None:
                return None
            new = throttled(known[0], known[1], now, retry_after)
            t.quotas[(provider, model)] = (known[0], new)
            return new

    def quota_stats(self, now: float) -> builtins.list[QuotaStats]:
        """Every declared quota and its window at ``now``."""
        with self._held() as t:
            found = []
            for key, (quota, state) in sorted(t.quotas.items()):
                window = self._window(t, key, now - quota.window, now)
                found.append(QuotaStats(
                    quota, state, sum(n for _, n, done in window if done),
                    sum(n for _, n, done in window if not done), len(window),
                    factor_at(quota, state, now)))
            return found

    def renew(self, object_id: str, epoch: int, lease_until: float) -> Claim | None:
        """Extend the lease if still held at ``epoch``."""
        with self._held() as t:
            row = t.objects.get(object_id)
            if row is None or row.epoch != epoch or row.lease_owner is None:
                return None
            row.lease_expires = float(lease_until)
            t.due_changed(row)
            return row.claim()

    def leases_held(self, owner_prefix: str, now: float) -> builtins.list[tuple[str, str, int]]:
        """Live leases whose owner starts with ``owner_prefix``."""
        with self._held() as t:
            return [(row.object_id, row.lease_owner, row.epoch) for row in t.objects.values()
                    if row.lease_owner is not None and row.lease_owner.startswith(owner_prefix)
                    and row.lease_expires is not None and row.lease_expires > now]

    def expire_lease(self, object_id: str, owner: str, epoch: int, now: float) -> bool:
        """End a lease at once when its holder is known to be dead."""
        with self._held() as t:
            row = t.objects.get(object_id)
            if row is None or row.epoch != epoch or row.lease_owner != owner:
                return False
            row.lease_expires = row.updated_at = float(now)
            t.due_changed(row)
            t.woken.append(object_id)
            return True

    def next_ready_at(self) -> float | None:
        """Earliest time an object becomes claimable: its ready time, or its lease
        expiry if later."""
        with self._held() as t:
            return t.next_due()

    def control(
        self,
        object_id: str,
        now: float,
        *,
        paused: bool | None = None,
        cancel: bool = False,
        unpark: bool = False,
    ) -> ObjectRow:
        """Pause, resume, cancel or unpark an object."""
        with self._held() as t:
            row = t.objects.get(object_id)
            if row is None:
                raise ObjectNotFoundError(f"no object {object_id!r} in {self.url}")
            if row.status in TERMINAL:
                raise ObjectTerminatedError(f"object {object_id!r} has already {row.status}")
            now = float(now)
            if paused is not None:
                row.paused, row.updated_at = paused, now
                if not paused and row.status == "paused":
                    row.status = "ready"
            if cancel:
                row.cancel_requested, row.updated_at = True, now
                row.ready_at = now if row.ready_at is None else min(row.ready_at, now)
            if unpark and row.parked:
                row.parked, row.note, row.ready_at, row.status = False, None, now, "ready"
                row.updated_at, row.crashes = now, 0
            t.due_changed(row)
            if cancel or unpark or paused is False:
                t.woken.append(object_id)
            return row.value()

    def control_flags(self, object_ids: Sequence[str]) -> dict[str, tuple[int, bool, bool]]:
        """Epoch and control flags of the given objects, in one read."""
        with self._held() as t:
            return {oid: (row.epoch, row.cancel_requested, row.paused)
                    for oid in object_ids if (row := t.objects.get(oid)) is not None}

    # -- inbox -------------------------------------------------------------------------

    def send(
        self, object_id: str, name: str, payload: bytes, dedupe_key: str | None, now: float,
        seal: bytes = b"",
    ) -> bool:
        """Queue an event; wake the object if it waits for that name or it is ``perdure:…``."""
        with self._held() as t:
            row = t.objects.get(object_id)
            if row is None:
                raise ObjectNotFoundError(f"no object {object_id!r} in {self.url}")
            if row.status in TERMINAL:
                raise ObjectTerminatedError(
                    f"object {object_id!r} has {row.status}; event {name!r} was not delivered"
                )
            if not t.insert_event(object_id, name, payload, dedupe_key, now, seal):
                return False
            t.wake_for_event(object_id, name, now)
            t.woken.append(object_id)
            return True

    def pending_events(self, object_id: str) -> builtins.list[Event]:
        """Unconsumed events in arrival order."""
        with self._held() as t:
            return [event.value() for event in t.inbox.get(object_id, {}).values()
                    if event.consumed_seq is None]

    # -- commits -------------------------------------------------------------------------

    def apply(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal] = ()
              ) -> Outcomes:
        """Apply fenced appends and store ``seals``, all at once under the lock; each
        append is checked in full before anything of it is written, so a refused one
        writes nothing and the others go through."""
        with self._held() as t:
            outcomes = self._apply(t, ops, now, seals)
        self._tell_commit(ops, outcomes)
        return outcomes

    def apply_now(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal] = ()
                  ) -> Outcomes | None:
        """``apply``, or ``None`` (nothing written) if another thread holds the lock."""
        try:
            with self._held(wait=False) as t:
                outcomes = self._apply(t, ops, now, seals)
        except _Busy:
            return None
        self._tell_commit(ops, outcomes)
        return outcomes

    @staticmethod
    def _apply(t: Tables, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal]
               ) -> Outcomes:
        for seal in seals:
            t.seals.setdefault(seal.digest, seal)
        return [apply_one(t, op, float(now), [record_params(rec) for rec in op.records])
                for op in ops]

    def writer(self, executor: concurrent.futures.Executor) -> Writer:
        """Commits on the event loop itself, or on the write thread while another thread
        holds the store (see ``InlineWriter``)."""
        return InlineWriter(self.apply_now, self.apply, executor)

    async def open_async(self) -> None:
        """Nothing to open."""

    async def close_async(self) -> None:
        """Nothing to release."""

    def check_damage(self) -> None:
        """Nothing to check: the store lives in this process's memory."""


class _Busy(Exception):  # noqa: N818 - internal control flow
    """The lock is taken and the caller asked not to wait for it."""
