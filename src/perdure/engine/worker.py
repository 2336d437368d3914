"""The node loop: claim → evaluate → act → append → commit, for many objects at once.

No scheduler tells a node what to do: it claims runnable objects from the store
with a lease, evaluates each with the pure cycle, and performs the one action
selected. Dormant objects are released, not held; a lost lease stops the
object on this node at its next command.

``Worker`` is the claim loop and the cycle of one claimed object. What it shares
with its parts is a ``Node`` (``engine/node.py``); the parts are found by name:
``engine/memory.py`` reads and vouches for memory, ``engine/leases.py`` renews leases
and polls control flags, ``engine/actions.py`` is the table of action handlers (with
``engine/ending.py``, ``engine/lineage.py`` and ``engine/invoke.py``), and
``engine/settings.py`` holds ``AgentDef`` and ``WorkerSettings``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from perdure.core.chain import Signer
from perdure.core.cycle import LocalPolicy, ObjectView, evaluate, read_memory
from perdure.core.events import REFINE_EVENT
from perdure.core.lifecycle import Status
from perdure.engine.actions import HANDLERS
from perdure.engine.draining import drain
from perdure.engine.held import HeldRecords
from perdure.engine.journal import StoreUnavailable
from perdure.engine.leases import (
    control_loop,
    heartbeat,
    node_gone,
    recover_dead_leases,
    renew_loop,
)
from perdure.engine.memory import checked_memory, pending_events
from perdure.engine.node import Active, Node
from perdure.engine.queues import declare_queues
from perdure.engine.quotas import declare_model_quotas
from perdure.engine.run import CHILD_EVENT
from perdure.engine.settings import AgentDef, WorkerSettings
from perdure.engine.stalls import LAG_INTERVAL, LoopLagMeter, LoopWatchdog
from perdure.errors import (
    IntegrityError,
    LeaseLostError,
    RecordDecodeError,
    StoreError,
)
from perdure.hooks import ClaimRound, Hooks, IntegrityFailure, LeaseLost, LoopLag
from perdure.keys.anchors import HeadAnchors
from perdure.keys.verifier import Verifier
from perdure.stores.base import Claim, Event, Store

__all__ = ["AgentDef", "HeldRecords", "Worker", "WorkerSettings"]

log = logging.getLogger("perdure.worker")


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
        hooks: Hooks | None = None,
    ) -> None:
        node = Node(store=store, signer=signer, policy=policy, agents=agents,
                    settings=settings, verifier=verifier,
                    anchors=anchors if anchors is not None else HeadAnchors(None),
                    clock=clock, capabilities=capabilities,
                    hooks=hooks if hooks is not None else Hooks())
        #: Where this node tells what happens to the objects it runs (``perdure.hooks``).
        self.hooks = node.hooks
        self.node = node
        self.store = store
        self.verifier = verifier
        self.anchors = node.anchors
        self.signer = signer
        self.policy = policy
        self.policy_ref = node.policy_ref
        self.agents = agents
        self.settings = settings
        self.clock = clock
        self.owner = node.owner
        self.capabilities = node.capabilities
        self.serves = node.serves
        self.route = node.route
        self.committer = node.committer
        self.held = node.held
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop ``run`` runs on
        node.on_damage = self._wake.set  # damage found: the claim loop stops at once
        #: This node's measure of its event loop's lag (``worst``: the worst seen).
        self.lag_meter = LoopLagMeter(self._lagged)

    def _lagged(self, seconds: float, worst: float) -> None:
        hooks = self.node.hooks
        if hooks.active:
            hooks.emit(LoopLag(self.signer.node_id, seconds, worst, LAG_INTERVAL))

    def wake(self) -> None:
        """Look for work now, from any thread: what a store cannot push, such as the
        node's clock skipped ahead (``perdure.testing``), so that objects due by it are
        claimed without waiting for the idle look. Nothing happens while the node does
        not run."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._wake.set)

    # -- the loop ---------------------------------------------------------------

    async def run(self, stop: asyncio.Event, abandon: asyncio.Event | None = None) -> int:
        """Claim and run objects until ``stop`` is set, then drain and let go.

        Draining (``engine/draining.py``) lets running steps finish and be recorded for up
        to ``drain_seconds``, or until ``abandon`` is set; returns how many steps it
        abandoned still running on code threads.

        A damaged store (``StoreCorruptError``, met at start-up, by a claim, or by a run
        reading an object) is no outage to wait out: the node claims nothing more, lets
        go, stops as above, and raises it (``App.serve`` says it once and checks again).

        Idle, the node sleeps until the next object is due (found through the
        store's ready-time index) or a wake-up is pushed (PostgreSQL ``NOTIFY``, SQLite's
        folder of sockets beside the file, the memory store's calls), looking anyway
        every ``idle_seconds`` (or ``poll_interval`` if longer); only where the store
        cannot push here does it poll every ``poll_interval``.
        """
        node = self.node
        loop = asyncio.get_running_loop()
        self._loop = loop
        log.info("node %s is up on %s, claiming work", self.signer.node_id, self.store.url,
                 extra={"action": "node_up"})
        renewer = asyncio.create_task(renew_loop(node, stop))
        watcher = asyncio.create_task(control_loop(node))
        lag_meter = self.lag_meter
        lagging = asyncio.create_task(lag_meter.run())

        def pushed(_object_id: str) -> None:
            # One hop to the loop per round is enough: the loop clears the flag before it
            # claims, so a push that finds it set is seen by the claim to come.
            if not self._wake.is_set():
                loop.call_soon_threadsafe(self._wake.set)

        unsubscribe = self.store.subscribe(pushed)
        # With queues, an object's end may free a slot another object waits for.
        ends = (self.store.subscribe_results(pushed) if self.settings.queues else None)
        # Pushed: a safety look every idle_seconds (or poll_interval, if longer); the
        # sleep ends sooner at the next due time or a push. Else: poll.
        idle = (max(self.settings.idle_seconds, self.settings.poll_interval)
                if unsubscribe is not None else self.settings.poll_interval)
        watchdog = None
        if self.settings.warn_stalls is not None:
            watchdog = LoopWatchdog(self.settings.warn_stalls)
            watchdog.start()
        await self._start_up()
        abandoned = 0
        try:
            await self._claim_loop(stop, idle)
        finally:
            for stop_push in (unsubscribe, ends):
                if stop_push is not None:
                    await loop.run_in_executor(None, stop_push)
            abandoned = await drain(node, abandon)
            with contextlib.suppress(Exception):  # the store may be down: it ages out then
                await node.write(node_gone, node)
            with contextlib.suppress(Exception):
                await self.store.close_async()
            for task in (renewer, watcher, lagging):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):
                await node.read(self.anchors.close)
            node.shutdown()
            if watchdog is not None:
                watchdog.stop()
            log.info("node %s stopped: worst event-loop lag %.1f ms", self.signer.node_id,
                     lag_meter.worst * 1000,
                     extra={"action": "node_stopped", "worst_lag_ms": lag_meter.worst * 1000})
        if node.damaged is not None:
            raise node.damaged
        return abandoned

    async def _start_up(self) -> None:
        """Register the node and warm what the first claim would otherwise wait for."""
        node = self.node
        try:
            async def register() -> None:
                await node.write(self.recover_dead_leases)
                await node.write(self.heartbeat)
                if self.settings.queues:
                    await node.write(declare_queues, node)
                if self.settings.model_quotas:
                    await node.write(declare_model_quotas, node)

            async def warm() -> None:  # what the first claim would otherwise wait for
                await node.read(self.verifier.refresh)
                await node.read(self.anchors.open)

            # The loop's own connection opens while the write thread does the above.
            await asyncio.gather(register(), warm(), self.store.open_async())
        except StoreError as exc:
            node.store_failed(exc)

    async def _claim_loop(self, stop: asyncio.Event, idle: float) -> None:
        """Claim as many objects as there are free slots; sleep while none is due."""
        node = self.node
        backoff = idle
        while not stop.is_set() and node.damaged is None:
            self._wake.clear()
            free = self.settings.concurrency - len(node.active)
            claims: list[Claim] = []
            wait = backoff
            if free > 0:
                now = self.clock()
                try:
                    claims = await node.write(
                        self.store.claim, self.owner, now, now + self.settings.lease_seconds,
                        free, self.route,
                    )
                    if not claims:
                        due = await node.read(self.store.next_ready_at)
                        if due is not None and due > now:
                            wait = min(wait, due - now)
                    node.store_ok()
                    backoff = idle
                    wait = min(wait, idle)
                    failed = False
                except StoreError as exc:
                    node.store_failed(exc)
                    backoff = min(max(backoff, self.settings.poll_interval) * 2, 5.0)
                    wait = backoff
                    failed = True
                if node.hooks.active:
                    node.hooks.emit(ClaimRound(self.signer.node_id,
                                               tuple(c.object_id for c in claims), failed))
            for claim in claims:
                self._start(claim)
            if claims and len(node.active) < self.settings.concurrency:
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

    def heartbeat(self) -> None:
        """Tell the store this node is alive, which agent versions and capabilities it has."""
        heartbeat(self.node)

    def recover_dead_leases(self) -> int:
        """End leases held by earlier processes of this node that are no longer alive.

        A restarted worker on the same node takes its crashed predecessor's objects
        back at once instead of waiting for their leases to lapse. Safety does not
        depend on this: every write is still fenced by the epoch.
        """
        return recover_dead_leases(self.node)

    def _start(self, claim: Claim) -> None:
        active_map = self.node.active
        earlier = active_map.get(claim.object_id)
        if earlier is not None and earlier.run is not None:
            # Our own older run lost its lease (e.g. the store was down longer than
            # the lease) and this node claimed the object again: the old run stops.
            earlier.run.lease_lost = True
        task = asyncio.create_task(self._handle(claim), name=f"perdure:{claim.object_id}")
        active = Active(claim, task)
        active_map[claim.object_id] = active

        def finished(_: asyncio.Task[None]) -> None:
            if active_map.get(claim.object_id) is active:  # not a newer claim's entry
                del active_map[claim.object_id]
            self._wake.set()

        task.add_done_callback(finished)

    # -- one object ---------------------------------------------------------------

    async def _handle(self, claim: Claim) -> None:
        oid = claim.object_id
        node = self.node
        try:
            await self._cycle(claim)
        except LeaseLostError as exc:
            log.warning("stopped %s: %s", oid, exc, extra={"action": "lease_lost"})
            if node.hooks.active:
                node.hooks.emit(LeaseLost(self.signer.node_id, oid, claim.epoch))
        except StoreUnavailable as exc:
            node.store_failed(exc.cause)
        except StoreError as exc:
            node.store_failed(exc)
        except asyncio.CancelledError:
            log.info("let go of %s on shutdown", oid, extra={"action": "released"})
            with contextlib.suppress(BaseException):
                await node.release(claim, ready_at=self.clock(), status=Status.READY)
        except Exception:
            log.exception("engine error on %s; its lease will lapse", oid,
                          extra={"action": "engine_error"})
        finally:
            node.slots.primed.pop(oid, None)  # read with its memory, if the agent never ran

    async def _cycle(self, claim: Claim) -> None:
        """Evaluate the claimed object and perform the action selected; after a mutate or
        delegate (the object stays here), evaluate again on the longer memory."""
        oid = claim.object_id
        node = self.node
        try:
            records, row, first_events = await checked_memory(node, oid, claim.epoch)
        except (IntegrityError, RecordDecodeError) as exc:
            # Never run code on memory that could not be vouched for, and never loop on it.
            log.error("integrity failure: parked %s without running it: %s", oid, exc,
                      extra={"action": "integrity_failure", "object_id": oid,
                             "seq": getattr(exc, "seq", None)})
            node.held.drop(oid)
            if node.hooks.active:
                node.hooks.emit(IntegrityFailure(self.signer.node_id, oid,
                                                 int(getattr(exc, "seq", 0) or 0), str(exc)))
            hint = "" if "perdure verify" in str(exc) else f"; run `perdure verify {oid}`"
            await node.release(
                claim, ready_at=None, status=Status.PARKED, parked=True,
                note=f"memory damaged or forged (node {self.signer.node_id} refused it): "
                     f"{exc}{hint}")
            return
        events: list[Event] | None = first_events
        while True:
            if row is None:  # the row read with the chain serves the first evaluation
                row = await node.read(self.store.get, oid)
            if events is None:  # so do the events read with it
                events = await node.read(pending_events, node, oid)
            refinements = children = 0
            for event in events:
                if event.name == REFINE_EVENT:
                    refinements += 1
                elif event.name == CHILD_EVENT:
                    children += 1
            facts = read_memory(records)  # once per cycle: a long history costs ms to read
            view = ObjectView(
                records=records,
                cancel_requested=row.cancel_requested,
                paused=row.paused,
                parked=row.parked,
                pending_events=frozenset(e.name for e in events),
                pending_refinements=refinements,
                pending_child_results=children,
                facts=facts,
            )
            decision = evaluate(view, self.policy, self.clock())
            log.debug("%s: %s (%s)", oid, decision.action, decision.reason,
                      extra={"action": "decided"})
            appended = await HANDLERS[decision.action](node, claim, records, decision, facts,
                                                       events)
            if appended is None:  # the object was let go
                return
            records = records + appended
            row = events = None
