"""A node as its parts see it: what the claim loop, the lease keeping, the memory read
and the action handlers share.

``Node`` holds the store and the threads it is reached through (reads on a pool of
two, writes on one write thread, so the event loop never waits on a driver), this
node's identity, policy, agents, settings and clock, the group committer, the records
it holds, the step runner and the objects it is running (``Active``). It also builds
the ``Journal`` of a claim, lets an object go without appending, and says once when
the store goes down and comes back.

The parts are functions over a ``Node``: ``engine/memory.py`` (read and vouch),
``engine/leases.py`` (renewal, control polling, dead leases), ``engine/actions.py``
(the handler table), ``engine/ending.py`` (terminal records, parking),
``engine/lineage.py`` (children and parents); ``engine/invoke.py`` calls user code;
``engine/worker.py`` runs the claim loop over them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perdure.core.chain import Signer
from perdure.core.cycle import LocalPolicy
from perdure.core.lifecycle import Phase, Status
from perdure.core.records import Record
from perdure.engine.code_threads import CodeThreads
from perdure.engine.held import HeldRecords
from perdure.engine.invoke import StepRunner
from perdure.engine.journal import Committer, Journal
from perdure.engine.quotas import QuotaGate
from perdure.engine.run import Run
from perdure.engine.settings import AgentDef, WorkerSettings
from perdure.engine.slots import Slots
from perdure.errors import StoreCorruptError, StoreError
from perdure.hooks import Hooks
from perdure.keys.anchors import HeadAnchors
from perdure.keys.sealer import KeyCache, SealedScan, Sealer
from perdure.keys.verifier import Verifier
from perdure.stores.base import Claim, Route, Store

__all__ = ["Active", "Node"]

log = logging.getLogger("perdure.worker")


@dataclass(eq=False)
class Active:
    """An object this node is running: its claim, its task and (once built) its run."""

    claim: Claim
    task: asyncio.Task[None]
    run: Run | None = None


class Node:
    """What one node's parts share (see the module)."""

    def __init__(
        self,
        *,
        store: Store,
        signer: Signer,
        policy: LocalPolicy,
        agents: Mapping[str, AgentDef],
        settings: WorkerSettings,
        verifier: Verifier,
        anchors: HeadAnchors,
        clock: Callable[[], float] = time.time,
        capabilities: frozenset[str] = frozenset(),
        hooks: Hooks | None = None,
    ) -> None:
        self.store = store
        self.verifier = verifier
        self.anchors = anchors
        self.signer = signer
        self.policy = policy
        self.policy_ref = policy.ref
        self.agents = agents
        self.settings = settings
        self.clock = clock
        self.owner = f"{signer.node_id}/{os.getpid()}"
        self.capabilities = frozenset(capabilities)
        self.serves = tuple(sorted(f"{a.name}@{a.version}" for a in agents.values()))
        # An object this process said it cannot do is skipped by it (``avoid_node`` is
        # the owner): a restarted node, its setting fixed, may try again.
        self.route = Route(node_id=self.owner, serves=self.serves,
                           capabilities=tuple(sorted(self.capabilities)))
        self.write_pool = concurrent.futures.ThreadPoolExecutor(1, "perdure-write")
        self.read_pool = concurrent.futures.ThreadPoolExecutor(2, "perdure-read")
        # The pools' threads start here (a node is built off its event loop), not at the
        # loop's first read or write: a thread's start waits until it runs, which on a
        # busy machine can hold the loop for a tenth of a second or more.
        for pool, threads in ((self.write_pool, 1), (self.read_pool, 2)):
            for _ in range(threads):
                pool.submit(_nothing)
        self.code_pool = CodeThreads(settings.concurrency + 4, "perdure-code")
        #: The step executor every run of this node gets (user code on the code pool).
        self.run_step = StepRunner(self.code_pool).run
        #: What this node tells listeners (``perdure.hooks``); inactive: no cost.
        self.hooks = hooks if hooks is not None else Hooks()
        self.committer = Committer(store, self.write_pool, clock, signer, hooks=self.hooks)
        self.slots = Slots(store, verifier, signer, self.write_pool, self.read_pool, clock)
        self.active: dict[str, Active] = {}
        self.held = HeldRecords(settings.held_records)
        #: Data keys this node unwrapped (secrets at rest), shared by its runs' sealers.
        self.key_cache = KeyCache()
        self.sealed_scan = SealedScan()  # which objects' memories hold sealed values
        self.store_down = False
        #: The damage this node found in the store (``StoreCorruptError``): it claims
        #: nothing more, lets go and stops, and ``Worker.run`` raises it.
        self.damaged: StoreCorruptError | None = None
        #: Called once when damage is found (the worker wakes its claim loop with it).
        self.on_damage: Callable[[], None] = lambda: None
        self.quotas = QuotaGate(self)  # model quotas, reserved through the store

    # -- store access off the event loop --------------------------------------------

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a read thread."""
        return await asyncio.get_running_loop().run_in_executor(self.read_pool, fn, *args)

    async def write(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the write thread."""
        return await asyncio.get_running_loop().run_in_executor(self.write_pool, fn, *args)

    def store_ok(self) -> None:
        """The store answered: say so if it was down."""
        if self.store_down:
            self.store_down = False
            log.warning("store reachable again; resuming", extra={"action": "store_up"})

    def store_failed(self, exc: StoreError) -> None:
        """The store failed: say so once, until it answers again. Damage
        (``StoreCorruptError``) is no outage to wait out: it is kept in ``damaged``, for
        the worker to stop on and its caller to say once."""
        if isinstance(exc, StoreCorruptError):
            if self.damaged is None:
                self.damaged = exc
                self.on_damage()
            return
        if not self.store_down:
            self.store_down = True
            log.error("store unavailable, backing off: %s", exc, extra={"action": "store_down"})

    def shutdown(self) -> None:
        """Stop the threads (the write and read threads finish what they were given)."""
        self.write_pool.shutdown(wait=True)
        self.read_pool.shutdown(wait=True)
        self.code_pool.shutdown()

    # -- one object -----------------------------------------------------------------

    def sealer(self, object_id: str, *, seal_all: bool = False) -> Sealer:
        """The sealer of ``object_id`` on this node (``perdure.keys.sealer``)."""
        return Sealer(self.store, self.settings.data_keys, object_id, seal_all=seal_all,
                      cache=self.key_cache)

    def journal(self, claim: Claim, records: list[Record]) -> Journal:
        """The journal extending ``records`` (the object's checked chain) under ``claim``."""
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
            hooks=self.hooks,
            slots=self.slots,
        )

    async def release(self, claim: Claim, *, ready_at: float | None, status: Status,
                      phase: Phase = Phase.EVALUATION, parked: bool = False,
                      note: str | None = None) -> None:
        """Let go of an object without appending: fenced row update only."""
        journal = Journal(object_id=claim.object_id, epoch=claim.epoch, head_seq=0,
                          head_hash="", trace_id="", signer=self.signer,
                          policy_ref=self.policy_ref, committer=self.committer,
                          clock=self.clock, claimed_at=self.clock())
        await journal.commit([], status=status, phase=phase, ready_at=ready_at, running=False,
                             release=True, parked=parked, note=note)


def _nothing() -> None:
    """What a pool runs to start its thread."""
