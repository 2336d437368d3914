"""The node loop: claim → evaluate → act → append → commit, for many objects at once.

No scheduler tells a node what to do: it claims runnable objects from the store
with a lease, evaluates each with the pure cycle, and performs the one action
selected. Dormant objects are released, not held; a lost lease stops the
object on this node at its next command.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from inspect import CO_COROUTINE
from types import FunctionType
from typing import Any

from perdure._gc import gc_paused
from perdure.core.chain import Signer
from perdure.core.codec import decode, encode
from perdure.core.cycle import (
    Action,
    Decision,
    LocalPolicy,
    MemoryFacts,
    ObjectView,
    evaluate,
    read_memory,
)
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import Status
from perdure.core.records import Kind, Record, RecordDraft
from perdure.core.trust import public_key_bytes, seal_event, when
from perdure.engine.anchors import HeadAnchors
from perdure.engine.context import StepInfo, step_scope
from perdure.engine.failures import error_body
from perdure.engine.instantiate import instantiate
from perdure.engine.journal import Committer, Journal, StoreUnavailable
from perdure.engine.run import (
    CHILD_EVENT,
    DeadlineExceeded,
    Park,
    Run,
    Suspend,
    SyncRun,
    child_finished_body,
)
from perdure.engine.verifier import Verifier
from perdure.errors import (
    CancelRequestedError,
    IntegrityError,
    LeaseLostError,
    NonDeterminismError,
    ObjectConflictError,
    RecordDecodeError,
    SerializationError,
    StoreError,
    UnknownAgentError,
)
from perdure.stores.base import Claim, Event, ObjectRow, Route, Signal, Store

__all__ = ["REFINE_EVENT", "AgentDef", "HeldRecords", "Worker", "WorkerSettings"]

log = logging.getLogger("perdure.worker")

REFINE_EVENT = "perdure:refine"


@dataclass(frozen=True, slots=True)
class AgentDef:
    """A registered agent: its name, code version, function and whether it is async."""

    name: str
    version: str
    fn: Callable[..., Any]
    is_async: bool
    requires: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a node works: objects at once, lease length, idle poll interval, drain time."""

    concurrency: int = 16
    lease_seconds: float = 30.0
    poll_interval: float = 0.1
    drain_seconds: float = 5.0
    control_interval: float = 0.25
    idle_seconds: float = 2.0  # longest idle sleep when the store pushes wake-ups
    unknown_agent_retry: float = 5.0
    # Records this node keeps of the objects it ran, so that claiming one again reads
    # and checks only what was appended since (0 turns it off). Roughly 1 KB each.
    held_records: int = 50_000

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.held_records < 0:
            raise ValueError("held_records must be 0 or more")
        if self.lease_seconds <= 0.2:
            raise ValueError("lease_seconds must be more than 0.2")
        if self.poll_interval <= 0:
            raise ValueError("poll_interval must be positive")


class HeldRecords:
    """The checked records of objects this node ran, least recently used dropped first.

    A record never changes once written, so an object claimed again needs only the
    records after the last one held: the store is asked for that tail, and its links
    are checked from the held head. Anything unexpected (a tail that does not link on,
    a store head behind the held one) drops the entry and the full chain is read.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[str, list[Record]] = OrderedDict()
        self._size = 0
        self.hits = 0
        self.misses = 0

    def get(self, object_id: str) -> list[Record] | None:
        """The held records of ``object_id`` (oldest first), or ``None``."""
        records = self._items.get(object_id)
        if records is not None:
            self._items.move_to_end(object_id)
        return records

    def put(self, object_id: str, records: list[Record]) -> None:
        """Hold ``records`` (checked, never changed afterwards) for ``object_id``."""
        self.drop(object_id)
        if not records or len(records) > self.limit:
            return
        self._items[object_id] = records
        self._size += len(records)
        while self._size > self.limit:
            _, old = self._items.popitem(last=False)
            self._size -= len(old)

    def drop(self, object_id: str) -> None:
        """Forget ``object_id``."""
        old = self._items.pop(object_id, None)
        if old is not None:
            self._size -= len(old)

    def __len__(self) -> int:
        return self._size


@dataclass
class _Active:
    claim: Claim
    task: asyncio.Task[None]
    run: Run | None = None


class Worker:
    """One node's loop over the shared store."""

    def __init__(
        self,
        *,
        store: Store,
        signer: Signer,
        policy: LocalPolicy,
        agents: Mapping[str, AgentDef],
        settings: WorkerSettings,
        verifier: Verifier,
        anchors: HeadAnchors | None = None,
        clock: Callable[[], float] = time.time,
        capabilities: frozenset[str] = frozenset(),
    ) -> None:
        self.store = store
        self.verifier = verifier
        self.anchors = anchors if anchors is not None else HeadAnchors(None)
        self.signer = signer
        self.policy = policy
        self.policy_ref = policy.ref
        self.agents = agents
        self.settings = settings
        self.clock = clock
        self.owner = f"{signer.node_id}/{os.getpid()}"
        self.capabilities = frozenset(capabilities)
        self.serves = tuple(sorted(f"{a.name}@{a.version}" for a in agents.values()))
        self.route = Route(node_id=signer.node_id, serves=self.serves,
                           capabilities=tuple(sorted(self.capabilities)))
        self._write_pool = concurrent.futures.ThreadPoolExecutor(1, "perdure-write")
        self._read_pool = concurrent.futures.ThreadPoolExecutor(2, "perdure-read")
        self._code_pool = concurrent.futures.ThreadPoolExecutor(
            settings.concurrency + 4, "perdure-code"
        )
        self.committer = Committer(store, self._write_pool, clock, signer)
        self._active: dict[str, _Active] = {}
        self.held = HeldRecords(settings.held_records)
        self._wake = asyncio.Event()
        self._store_down = False
        self.completed = 0

    # -- store access off the event loop --------------------------------------------

    async def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._read_pool, fn, *args)

    async def _write(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._write_pool, fn, *args)

    def _store_ok(self) -> None:
        if self._store_down:
            self._store_down = False
            log.warning("store reachable again; resuming", extra={"action": "store_up"})

    def _store_failed(self, exc: StoreError) -> None:
        if not self._store_down:
            self._store_down = True
            log.error("store unavailable, backing off: %s", exc, extra={"action": "store_down"})

    # -- the loop ---------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run objects until ``stop`` is set, then drain and let go.

        Idle, the node sleeps until the next object is due (found through the
        store's ready-time index) or a wake-up arrives: pushed by the store where it
        can (PostgreSQL NOTIFY), otherwise by polling every ``poll_interval``.
        """
        loop = asyncio.get_running_loop()
        log.info("node %s is up on %s, claiming work", self.signer.node_id, self.store.url,
                 extra={"action": "node_up"})
        renewer = asyncio.create_task(self._renew_loop(stop))
        watcher = asyncio.create_task(self._control_loop())

        def pushed(_object_id: str) -> None:
            loop.call_soon_threadsafe(self._wake.set)

        unsubscribe = self.store.subscribe(pushed)
        idle = self.settings.idle_seconds if unsubscribe is not None else (
            self.settings.poll_interval
        )
        backoff = idle
        try:
            async def register() -> None:
                await self._write(self.recover_dead_leases)
                await self._write(self.heartbeat)

            async def warm() -> None:  # what the first claim would otherwise wait for
                await self._read(self.verifier.refresh)
                await self._read(self.anchors.open)

            # The loop's own connection opens while the write thread does the above.
            await asyncio.gather(register(), warm(), self.store.open_async())
        except StoreError as exc:
            self._store_failed(exc)
        try:
            while not stop.is_set():
                self._wake.clear()
                free = self.settings.concurrency - len(self._active)
                claims: list[Claim] = []
                wait = backoff
                if free > 0:
                    now = self.clock()
                    try:
                        claims = await self._write(
                            self.store.claim, self.owner, now, now + self.settings.lease_seconds,
                            free, self.route,
                        )
                        if not claims:
                            due = await self._read(self.store.next_ready_at)
                            if due is not None and due > now:
                                wait = min(wait, due - now)
                        self._store_ok()
                        backoff = idle
                        wait = min(wait, idle)
                    except StoreError as exc:
                        self._store_failed(exc)
                        backoff = min(max(backoff, self.settings.poll_interval) * 2, 5.0)
                        wait = backoff
                for claim in claims:
                    self._start(claim)
                if claims and len(self._active) < self.settings.concurrency:
                    continue
                stop_wait = asyncio.ensure_future(stop.wait())
                wake_wait = asyncio.ensure_future(self._wake.wait())
                try:
                    # Every slot busy: nothing to claim until an object lets go, which
                    # sets the wake-up; no polling meanwhile.
                    await asyncio.wait(
                        [stop_wait, wake_wait],
                        timeout=max(wait, 0.001) if free > 0 else None,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    stop_wait.cancel()
                    wake_wait.cancel()
        finally:
            if unsubscribe is not None:
                await loop.run_in_executor(None, unsubscribe)
            await self._drain()
            with contextlib.suppress(Exception):
                await self.store.close_async()
            for task in (renewer, watcher):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):
                await self._read(self.anchors.close)
            self._write_pool.shutdown(wait=True)
            self._read_pool.shutdown(wait=True)
            self._code_pool.shutdown(wait=False, cancel_futures=True)

    def heartbeat(self) -> None:
        """Tell the store this node is alive, which agent versions and capabilities it has."""
        self.store.heartbeat(self.signer.node_id, self.serves, sorted(self.capabilities),
                             self.clock())

    def recover_dead_leases(self) -> int:
        """End leases held by earlier processes of this node that are no longer alive.

        A restarted worker on the same node takes its crashed predecessor's objects
        back at once instead of waiting for their leases to lapse. Safety does not
        depend on this: every write is still fenced by the epoch.
        """
        now = self.clock()
        ended = 0
        for object_id, owner, epoch in self.store.leases_held(f"{self.signer.node_id}/", now):
            pid_text = owner.rsplit("/", 1)[-1]
            if not pid_text.isdigit() or owner == self.owner or _alive(int(pid_text)):
                continue
            if self.store.expire_lease(object_id, owner, epoch, now):
                ended += 1
                log.info("took back %s from dead process %s", object_id, owner,
                         extra={"action": "lease_recovered"})
        return ended

    def _start(self, claim: Claim) -> None:
        earlier = self._active.get(claim.object_id)
        if earlier is not None and earlier.run is not None:
            # Our own older run lost its lease (e.g. the store was down longer than
            # the lease) and this node claimed the object again: the old run stops.
            earlier.run.lease_lost = True
        task = asyncio.create_task(self._handle(claim), name=f"perdure:{claim.object_id}")
        active = _Active(claim, task)
        self._active[claim.object_id] = active

        def finished(_: asyncio.Task[None]) -> None:
            if self._active.get(claim.object_id) is active:  # not a newer claim's entry
                del self._active[claim.object_id]
            self._wake.set()

        task.add_done_callback(finished)

    async def _drain(self) -> None:
        if not self._active:
            return
        for active in self._active.values():
            if active.run is not None:
                active.run.release_requested = True
        tasks = [a.task for a in self._active.values()]
        _done, pending = await asyncio.wait(tasks, timeout=self.settings.drain_seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)

    async def _renew_loop(self, stop: asyncio.Event) -> None:
        interval = self.settings.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self._write(self.heartbeat)
            except StoreError as exc:
                self._store_failed(exc)
            # The heads this node saw reach its key folder (a restarted node keeps them).
            await self._read(self.anchors.flush)
            if await self._revoked():
                stop.set()  # records it writes would count for nobody: let everything go
            for object_id, active in list(self._active.items()):
                until = self.clock() + self.settings.lease_seconds
                try:
                    claim = await self._write(
                        self.store.renew, object_id, active.claim.epoch, until
                    )
                except StoreError as exc:
                    self._store_failed(exc)
                    continue
                run = active.run
                if claim is None:
                    if active.task.done() or await self._released_by_us(object_id, active):
                        continue  # the run let the object go itself; nothing was lost
                    log.warning("lease on %s lost", object_id, extra={"action": "lease_lost"})
                    if run is not None:
                        run.lease_lost = True
                    continue
                if run is not None:
                    run.cancel_requested = claim.cancel_requested
                    run.pause_requested = claim.paused
                    run.release_requested = stop.is_set()

    async def _revoked(self) -> bool:
        """Whether this node's own key was revoked (a revocation published in the store
        reaches the node within the verifier's ``max_age_seconds``)."""
        try:
            await self._read(self.verifier.refresh_if_stale)
        except StoreError as exc:
            self._store_failed(exc)
            return False
        since = self.verifier.ring.revoked_since(public_key_bytes(self.signer.private_key))
        if since is None or since > self.clock():
            return False
        log.error("this node's key was revoked (from %s): it stops; give it a new key "
                  "(`perdure keys rotate`) and have it certified", when(since),
                  extra={"action": "key_revoked"})
        return True

    async def _control_loop(self) -> None:
        """Notice cancel and pause requests (and lost leases) within ``control_interval``.

        One read for all running objects; the run acts on the flags at its next
        command boundary.
        """
        while True:
            await asyncio.sleep(self.settings.control_interval)
            if not self._active:
                continue
            active = dict(self._active)
            try:
                flags = await self._read(self.store.control_flags, list(active))
            except StoreError as exc:
                self._store_failed(exc)
                continue
            for object_id, entry in active.items():
                run = entry.run
                found = flags.get(object_id)
                if run is None or found is None or entry.task.done():
                    continue
                epoch, cancel, paused = found
                if epoch != entry.claim.epoch:
                    log.warning("lease on %s lost (epoch %d is now %d)", object_id,
                                entry.claim.epoch, epoch, extra={"action": "lease_lost"})
                    run.lease_lost = True
                    continue
                run.cancel_requested = run.cancel_requested or cancel
                run.pause_requested = paused

    async def _released_by_us(self, object_id: str, active: _Active) -> bool:
        try:
            row = await self._read(self.store.get, object_id)
        except StoreError:
            return False
        return row is not None and row.epoch == active.claim.epoch and row.lease_owner is None

    # -- one object ---------------------------------------------------------------

    async def _handle(self, claim: Claim) -> None:
        oid = claim.object_id
        try:
            await self._cycle(claim)
        except LeaseLostError as exc:
            log.warning("stopped %s: %s", oid, exc, extra={"action": "lease_lost"})
        except StoreUnavailable as exc:
            self._store_failed(exc.cause)
        except StoreError as exc:
            self._store_failed(exc)
        except asyncio.CancelledError:
            log.info("let go of %s on shutdown", oid, extra={"action": "released"})
            with contextlib.suppress(BaseException):
                await self._release_plain(claim, ready_at=self.clock(), status="ready")
        except Exception:
            log.exception("engine error on %s; its lease will lapse", oid,
                          extra={"action": "engine_error"})

    def _journal(self, claim: Claim, records: list[Record]) -> Journal:
        head = records[-1]
        oid, genesis, note = claim.object_id, records[0].hash, self.anchors.note
        return Journal(
            object_id=oid,
            epoch=claim.epoch,
            head_seq=head.seq,
            head_hash=head.hash,
            trace_id=head.trace_id,
            signer=self.signer,
            policy_ref=self.policy_ref,
            committer=self.committer,
            clock=self.clock,
            claimed_at=self.clock(),
            anchor=lambda seq, digest: note(oid, genesis, seq, digest),
        )

    async def _release_plain(self, claim: Claim, *, ready_at: float | None, status: str,
                             phase: str = "evaluation", parked: bool = False,
                             note: str | None = None) -> None:
        """Let go of an object without appending: fenced row update only."""
        journal = Journal(claim.object_id, claim.epoch, 0, "", "", self.signer, self.policy_ref,
                          self.committer, self.clock, self.clock())
        await journal.commit([], status=status, phase=phase, ready_at=ready_at, running=False,
                             release=True, parked=parked, note=note)

    async def _cycle(self, claim: Claim) -> None:
        oid = claim.object_id
        try:
            records, row = await self._checked_memory(oid)
        except (IntegrityError, RecordDecodeError) as exc:
            # Never run code on memory that could not be vouched for, and never loop on it.
            log.error("integrity failure: parked %s without running it: %s", oid, exc,
                      extra={"action": "integrity_failure", "object_id": oid,
                             "seq": getattr(exc, "seq", None)})
            self.held.drop(oid)
            hint = "" if "perdure verify" in str(exc) else f"; run `perdure verify {oid}`"
            await self._release_plain(
                claim, ready_at=None, status="parked", parked=True,
                note=f"memory damaged or forged (node {self.signer.node_id} refused it): "
                     f"{exc}{hint}")
            return
        while True:
            if row is None:  # the row read with the chain serves the first evaluation
                row = await self._read(self.store.get, oid)
            events: list[Event] = await self._read(self._events, oid)
            refinements = [e for e in events if e.name == REFINE_EVENT]
            child_results = [e for e in events if e.name == CHILD_EVENT]
            facts = read_memory(records)  # once per cycle: a long history costs ms to read
            view = ObjectView(
                records=records,
                cancel_requested=row.cancel_requested,
                paused=row.paused,
                parked=row.parked,
                pending_events=frozenset(e.name for e in events),
                pending_refinements=len(refinements),
                pending_child_results=len(child_results),
                facts=facts,
            )
            decision = evaluate(view, self.policy, self.clock())
            log.debug("%s: %s (%s)", oid, decision.action, decision.reason,
                      extra={"action": "decided"})
            if decision.action in (Action.MUTATE, Action.DELEGATE):
                fold = self._mutate if decision.action is Action.MUTATE else self._fold_children
                journal = self._journal(claim, records)
                try:
                    records = records + await fold(
                        journal, records,
                        refinements if decision.action is Action.MUTATE else child_results)
                except CancelRequestedError:  # written; the next evaluation sees the cancel
                    records = records + await self._read(self.store.chain, oid,
                                                         records[-1].seq, records[-1].hash)
                row = None
                continue
            await self._act(claim, records, decision, facts, events)
            return

    async def _checked_memory(self, oid: str) -> tuple[list[Record], ObjectRow | None]:
        """The object's whole chain, vouched for, and its row.

        Links and hashes are checked up to the head the row records; the newest record's
        signature (or commit seal) must verify under a key certified by a root this node
        trusts (it chains every record before it); and the chain must reach the highest
        head this node saw of the object. Reads only the tail when this node holds the
        earlier records; falls back to the full chain if the tail does not fit on.
        Raises ``IntegrityError`` or ``RecordDecodeError`` when the stored chain cannot
        be vouched for.
        """
        held = self.held.get(oid)
        if held is not None:
            last = held[-1]
            try:
                tail: list[Record] = await self._read(self.store.chain, oid, last.seq,
                                                      last.hash)
                records: list[Record] = held + tail
                row = await self._read(self._vouch, oid, records, len(held))
            except (IntegrityError, RecordDecodeError) as exc:
                log.info("%s: held records do not fit the store (%s); reading the whole chain",
                         oid, exc, extra={"action": "held_records_dropped"})
                self.held.drop(oid)
            else:
                self.held.hits += 1
                self.held.put(oid, records)
                return records, row
        self.held.misses += 1
        records = await self._read(self.store.chain, oid)
        if not records:
            raise IntegrityError(oid, 1, "object has no records")
        row = await self._read(self._vouch, oid, records, 0)
        self.held.put(oid, records)
        return records, row

    def _vouch(self, oid: str, records: list[Record], known: int) -> ObjectRow | None:
        """On a read thread: the row must name the chain's head, the chain must reach
        what this node saw, and its newest record must be signed by a trusted key
        (unless this node already holds it: the first ``known`` records, or the head it
        saw itself). Returns the row."""
        row = self._head_of(oid, records)
        last = records[-1]
        rolled, seen = self.anchors.seen(oid, records)
        if rolled is not None:
            raise IntegrityError(oid, *rolled)
        if len(records) > known and not (seen is not None and seen[1] == last.seq
                                         and seen[2] == last.hash):
            self.verifier.check_head(oid, records)
            self.anchors.note(oid, records[0].hash, last.seq, last.hash)
        return row

    def _events(self, oid: str) -> list[Event]:
        """On a read thread: the object's pending events, their senders looked up."""
        events = self.store.pending_events(oid)
        if events:
            self.verifier.warm(events)
        return events

    def _head_of(self, oid: str, records: list[Record]) -> ObjectRow | None:
        """The chain must end where the object's row (returned) says its head is."""
        head: ObjectRow | None = self.store.get(oid)
        last = records[-1]
        if head is not None and head.head_seq != last.seq:
            raise IntegrityError(oid, last.seq + 1, f"chain ends at #{last.seq} but the "
                                 f"object's head is #{head.head_seq} (records missing)")
        if head is not None and head.head_hash != last.hash:
            raise IntegrityError(oid, last.seq, "last record's hash differs from the "
                                 "object's recorded head")
        return head

    async def _act(self, claim: Claim, records: list[Record], decision: Decision,
                   facts: MemoryFacts, events: list[Event]) -> None:
        if decision.action in (Action.EXECUTE, Action.REENTRY):
            await self._execute(claim, records, decision, facts, events)
            return
        handler = {
            Action.TERMINATE: self._terminate,
            Action.DORMANCY: self._dormancy,
        }[decision.action]
        await handler(claim, records, decision, facts)

    def _refusal(self, event: Event) -> tuple[str | None, RecordDraft | None]:
        """The digest of ``event`` if its seal verifies, or a refusal record for it."""
        digest, problem = self.verifier.check_event(event)
        if problem is None:
            return digest, None
        log.error("refused event %r #%d for %s: %s", event.name, event.event_id,
                  event.object_id, problem,
                  extra={"action": "integrity_failure", "object_id": event.object_id})
        return digest, RecordDraft(Kind.EVENT_REFUSED, {
            "event_id": event.event_id, "name": event.name, "event_hash": digest,
            "reason": problem})

    async def _mutate(self, journal: Journal, records: list[Record], refinements: list[Event]
                      ) -> list[Record]:
        intent = read_memory(records).intent
        drafts: list[RecordDraft] = []
        for event in refinements:
            digest, refused = self._refusal(event)
            if refused is not None:
                drafts.append(refused)
                continue
            try:
                changes = decode(event.payload)
                intent = intent.refined(dict(changes))
                drafts.append(RecordDraft(Kind.INTENT_REFINED, {
                    "intent": intent.to_body(), "changes": changes, "event_id": event.event_id,
                    "event_hash": digest}))
            except (ValueError, TypeError) as exc:
                drafts.append(RecordDraft(Kind.PROGRESS, {
                    "fields": {"refinement_rejected": str(exc), "event_id": event.event_id}}))
        # A refined ``requires`` must reach the row too: claims route by it.
        routed = any(d.kind == Kind.INTENT_REFINED and "requires" in d.body["changes"]
                     for d in drafts)
        return await journal.commit(drafts, phase="mutation",
                                    consume_event_ids=[e.event_id for e in refinements],
                                    requires=tuple(intent.requires) if routed else None)

    async def _fold_children(self, journal: Journal, records: list[Record],
                             signals: list[Event]) -> list[Record]:
        """Delegation phase: write finished children's results into memory, consuming their
        signals, without running the agent (it runs once, when all it awaits are done)."""
        known = {str(r.body.get("child_id")) for r in records if r.kind == Kind.CHILD_FINISHED}
        drafts: list[RecordDraft] = []
        for event in signals:
            digest, refused = self._refusal(event)
            if refused is not None:
                drafts.append(refused)
                continue
            body = child_finished_body(event.payload, event.event_id, digest)
            if body is not None and str(body["child_id"]) not in known:
                known.add(str(body["child_id"]))
                drafts.append(RecordDraft(Kind.CHILD_FINISHED, body))
        if not drafts:
            drafts.append(RecordDraft(Kind.PROGRESS, {"fields": {
                "ignored_child_signals": [e.event_id for e in signals]}}))
        return await journal.commit(drafts, phase="delegation",
                                    consume_event_ids=[e.event_id for e in signals])

    def _parent_signal(self, records: list[Record], body: dict[str, Any]) -> Signal | None:
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
        seal, _ = seal_event(self.signer.sign, self.signer.node_id, context.parent_id,
                             CHILD_EVENT, data, dedupe, os.urandom(12).hex())
        return Signal(context.parent_id, CHILD_EVENT, data, dedupe, seal)

    async def _finish(self, journal: Journal, records: list[Record], body: dict[str, Any], *,
                      status: str, result: bytes | None = None) -> None:
        """Write the terminal record, signalling the parent in the same transaction.

        A completion is written only if no cancel is pending: an object whose agent
        returns while a cancel waits ends cancelled.
        """
        error = body.get("error")
        note = None
        if status == "failed" and isinstance(error, dict):
            note = f"{_short_type(error.get('type'))}: {error.get('message', '')}"[:500]
        # The live children are asked to cancel in the terminal record's own transaction
        # (every object whose row names this one as parent: also a child whose delegation
        # record a crash kept from being written), so the request is never lost.
        children = self.policy.cancel_children
        try:
            try:
                await journal.commit([RecordDraft(Kind.TERMINATED, body)], status=status,
                                     phase="termination", ready_at=None, running=False,
                                     release=True, result=result, note=note,
                                     unless_cancelled=status == "completed",
                                     signal=self._parent_signal(records, body),
                                     cancel_children=children)
            except LeaseLostError:
                # A refused completion: the lease is lost, or a cancel is pending (a store
                # may say either way); if this node still holds the object, it is the cancel.
                if status != "completed" or not await self._cancel_pending(journal):
                    raise
                raise CancelRequestedError(journal.object_id) from None
        except CancelRequestedError:
            cancelled = {"outcome": "cancelled", "reason": "cancelled before the completion "
                         "was recorded (the agent had returned)"}
            await journal.commit([RecordDraft(Kind.TERMINATED, cancelled)], status="cancelled",
                                 phase="termination", ready_at=None, running=False,
                                 release=True, signal=self._parent_signal(records, cancelled),
                                 cancel_children=children)
        self.held.drop(journal.object_id)
        self.completed += 1

    async def _cancel_pending(self, journal: Journal) -> bool:
        """Whether this node still holds the object (its epoch) and a cancel is pending."""
        try:
            flags = await self._read(self.store.control_flags, [journal.object_id])
        except StoreError as exc:
            raise StoreUnavailable(exc) from exc
        found = flags.get(journal.object_id)
        return found is not None and found[0] == journal.epoch and found[1]

    async def _terminate(self, claim: Claim, records: list[Record], decision: Decision,
                         facts: MemoryFacts) -> None:
        outcome = decision.status  # a terminate decision's status is its outcome
        if facts.terminated is not None:
            await self._release_plain(claim, ready_at=None, status=outcome.value,
                                      phase="termination")
            return
        body: dict[str, Any] = {"outcome": outcome.value, "reason": decision.reason}
        if outcome is not Status.CANCELLED:
            body["error"] = {"type": "perdure:Terminated", "message": decision.reason}
        journal = self._journal(claim, records)
        await self._finish(journal, records, body, status=outcome.value)

    async def _refresh_flags(self, run: Run, epoch: int) -> None:
        """Read the object's cancel and pause flags now (before a step starts)."""
        try:
            flags = await self._read(self.store.control_flags, [run.object_id])
        except StoreError as exc:
            raise StoreUnavailable(exc) from exc
        found = flags.get(run.object_id)
        if found is None:
            return
        current, cancel, paused = found
        if current != epoch:
            run.lease_lost = True
        run.cancel_requested = run.cancel_requested or cancel
        run.pause_requested = paused

    async def _dormancy(self, claim: Claim, records: list[Record], decision: Decision,
                        facts: MemoryFacts) -> None:
        status = decision.status
        if status is Status.PAUSED:
            ready_at: float | None = self.clock()
        elif status is Status.PARKED:
            ready_at = None
        elif status is Status.READY:  # not for this node: ready again later, for any node
            ready_at = self.clock() + self.settings.unknown_agent_retry
        else:
            ready_at = _by_deadline(decision.wake_at, facts.intent.deadline)
        event = facts.dormancy.event if facts.dormancy is not None else None
        journal = self._journal(claim, records)
        await journal.commit([], status=status.value, phase="dormancy", ready_at=ready_at,
                             running=False, waiting_event=event, release=True,
                             parked=status is Status.PARKED)

    async def _run_step(self, info: StepInfo, fn: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> Any:
        token = step_scope.set(info)
        try:
            # An ``async def`` function says so in its code flags: a cheaper test than
            # ``iscoroutinefunction``'s, which still decides everything else.
            if ((type(fn) is FunctionType and fn.__code__.co_flags & CO_COROUTINE)
                    or asyncio.iscoroutinefunction(fn)):
                return await fn(*args, **kwargs)

            def call() -> Any:
                # Pool threads are reused (also for sync agent code): reset, never leak.
                inner = step_scope.set(info)
                try:
                    return fn(*args, **kwargs)
                finally:
                    step_scope.reset(inner)

            return await asyncio.get_running_loop().run_in_executor(self._code_pool, call)
        finally:
            step_scope.reset(token)

    async def _execute(self, claim: Claim, records: list[Record], decision: Decision,
                       facts: MemoryFacts, events: list[Event]) -> None:
        oid = claim.object_id
        intent: Intent = facts.intent
        agent = self.agents.get(intent.agent)
        if agent is None or agent.version != intent.version:
            served = "not registered" if agent is None else f"served at version {agent.version}"
            log.warning("%s needs agent %s@%s, %s on this node; leaving it", oid, intent.agent,
                        intent.version, served, extra={"action": "unknown_agent"})
            await self._release_plain(
                claim, ready_at=self.clock() + self.settings.unknown_agent_retry, status="ready",
                note=f"agent {intent.agent}@{intent.version} is {served} on node "
                     f"{self.signer.node_id}",
            )
            return
        journal = self._journal(claim, records)
        loop = asyncio.get_running_loop()
        if claim.crashes > self.policy.max_crashes:
            # Even replaying killed its workers (the agent's own code between steps):
            # park without running anything.
            reason = (f"the worker died {claim.crashes} times in a row while running this "
                      f"object after record #{records[-1].seq}; fix the cause, then run "
                      f"`perdure resume {oid}`")
            await self._park(journal, RuntimeError(reason), RecordDraft(Kind.PARKED, {
                "reason": reason, "code": "worker_died", "crashes": claim.crashes}))
            return

        async def load_events() -> list[Event]:
            try:
                return list(await self._read(self._events, oid))
            except StoreError as exc:  # not the agent's failure: abandon the run, retry later
                raise StoreUnavailable(exc) from exc

        run: Run

        async def refresh_flags() -> None:
            await self._refresh_flags(run, claim.epoch)

        with gc_paused():  # it indexes every record: as many new lists on a long history
            run = Run(journal=journal, intent=intent, context=facts.context, records=records,
                      load_events=load_events, pending_events=events,
                      step_executor=self._run_step, clock=self.clock,
                      spawn=self._spawn, capabilities=self.capabilities,
                      check_event=self.verifier.check_event, refresh_flags=refresh_flags,
                      crashes=claim.crashes, max_crashes=self.policy.max_crashes)
        run.cancel_requested = claim.cancel_requested
        active = self._active.get(oid)
        if active is not None:
            active.run = run
        try:
            if agent.is_async:
                result = await agent.fn(run, *intent.args, **intent.kwargs)
            else:
                sync = SyncRun(run, loop)
                result = await loop.run_in_executor(
                    self._code_pool, lambda: agent.fn(sync, *intent.args, **intent.kwargs)
                )
            run.check_finished()
            try:
                result_bytes = encode(result, what=f"result of agent {intent.agent!r}")
            except SerializationError as exc:
                await self._finish_failed(journal, records, exc)
                return
            await self._finish(journal, records,
                               {"outcome": "completed", "result": decode(result_bytes)},
                               status="completed", result=result_bytes)
        except Suspend as sus:
            await journal.commit(sus.drafts, status=sus.status, phase="dormancy",
                                 ready_at=_by_deadline(sus.ready_at, run.intent.deadline),
                                 running=False, waiting_event=sus.waiting_event, release=True,
                                 consume_event_ids=sus.consume_event_ids,
                                 requires=sus.requires, avoid_node=sus.avoid_node)
        except Park as park:
            err = park.error
            record = park.record
            if record is None and isinstance(err, NonDeterminismError):
                log.error("parked %s: %s", oid, err, extra={"action": "parked_nondeterminism"})
                record = RecordDraft(Kind.NONDETERMINISM, {
                    "reason": str(err), "position": err.position, "recorded": err.recorded,
                    "found": err.found, "agent_version": agent.version})
            await self._park(journal, err, record)
        except CancelRequestedError:
            await self._finish(journal, records, {"outcome": "cancelled", "reason": "cancelled"},
                               status="cancelled")
        except DeadlineExceeded as exc:
            await self._finish(journal, records, {
                "outcome": "failed", "reason": "deadline passed",
                "error": {"type": "perdure:DeadlineExceeded", "message": str(exc)}},
                status="failed")
        except (LeaseLostError, StoreUnavailable, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - the agent's own failure ends the object
            await self._finish_failed(journal, records, exc)

    async def _park(self, journal: Journal, err: Exception, record: RecordDraft | None) -> None:
        """Park the object for a person, with ``record`` saying why in memory."""
        if not isinstance(err, NonDeterminismError):
            log.error("parked %s: %s", journal.object_id, err, extra={"action": "parked"})
        await journal.commit([record] if record is not None else [], status="parked",
                             phase="evaluation", ready_at=None, running=False, release=True,
                             parked=True, note=str(err)[:500])

    async def _finish_failed(self, journal: Journal, records: list[Record],
                             exc: BaseException) -> None:
        await self._finish(journal, records, {"outcome": "failed", "reason": "agent raised",
                                              "error": error_body(exc)}, status="failed")

    async def _spawn(self, agent: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     child_id: str, parent: Context) -> str:
        """Create a child object (idempotent on its id); returns the child's agent version."""
        name = agent if isinstance(agent, str) else getattr(agent, "__perdure_agent__", None)
        definition = self.agents.get(str(name)) if name is not None else None
        if definition is None:
            raise UnknownAgentError(
                f"cannot delegate to {agent!r}: no such agent is registered on this node"
            )
        new = instantiate(definition, args, kwargs, object_id=child_id, signer=self.signer,
                          policy_ref=self.policy_ref, now=self.clock(), parent=parent)
        if not await self._write(self.store.create, new, self.clock()):
            row = await self._read(self.store.get, child_id)
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


def _short_type(type_path: Any) -> str:
    """``module:Qual.Name`` as ``Name`` (for a one-line note)."""
    return str(type_path or "Error").rpartition(":")[2].rpartition(".")[2] or "Error"


def _by_deadline(ready_at: float | None, deadline: float | None) -> float | None:
    """When a dormant object must be looked at again: no later than its deadline."""
    if deadline is None:
        return ready_at
    return deadline if ready_at is None else min(ready_at, deadline)


def _alive(pid: int) -> bool:
    """True if a process with ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
