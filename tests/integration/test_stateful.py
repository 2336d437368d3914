"""Random steps, crashes, events, control requests and clock moves against a real store.

A Hypothesis state machine drives real objects in a real SQLite file through
real workers of two nodes (two Apps, two keys). Nodes run only inside a rule, for
a short bounded time, and are stopped before it returns, so between rules the
store is still and every invariant is checked against it exactly.

- A crash is a step raising ``SimulatedCrash``, a ``BaseException`` nothing in
  perdure catches: the object's task dies holding its lease and nothing is
  released or recorded, as if the process had been killed. Only after the lease
  lapses can the object be claimed again.
- A stall blocks a node's event loop inside a step for longer than its lease
  while the other node runs: the other node takes the object over, and the
  stalled one wakes up stale. Its writes must be fenced off.
- The side-effect target remembers results by idempotency key and refuses a
  step whose fencing epoch is below the highest it has seen for the object.

By default a bounded, fixed set of examples runs. ``-m slow`` adds a longer soak on
fresh random examples; ``PERDURE_SOAK_SCALE=N`` multiplies the examples and the steps
of the bounded run (which then also draws fresh random examples).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

import perdure
from perdure import Kind, ObjectConflictError, ObjectTerminatedError, SyncRun
from tests.cluster import one_root

LEASE = 0.4  # seconds; short so that crashed objects come back quickly
STALL = LEASE + 0.2  # a frozen node sleeps past its lease
TERMINAL = frozenset({"completed", "failed", "cancelled"})
SCALE = max(1, int(os.environ.get("PERDURE_SOAK_SCALE", "1")))
KINDS = st.sampled_from(["chain", "sleepy", "waiter", "sync"])
WHEN = st.sampled_from(["before", "after"])


class SimulatedCrash(BaseException):
    """The node dies mid-step: nothing after this point runs, records or releases."""


class StaleWriteError(Exception):
    """The side-effect target refuses a write carrying an outdated fencing epoch."""


def _quiet_crashes(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Keep a crashed object's dead task quiet; report anything else as usual."""
    if isinstance(context.get("exception"), SimulatedCrash):
        return
    loop.default_exception_handler(context)


def value_of(i: int) -> int:
    """What step ``work(i)`` returns."""
    return i * i + 1


@dataclass
class Expected:
    """What the test knows about one object from the requests it made."""

    kind: str
    n: int
    paused: bool = False
    cancelled: bool = False
    go_payloads: list[int] = field(default_factory=list)  # accepted "go" events, in order
    dedupe_keys: set[str] = field(default_factory=set)

    def result(self) -> dict[str, Any]:
        """The agent's return value if it completes."""
        if self.kind == "waiter":
            return {"total": value_of(0) + value_of(1), "payloads": self.go_payloads[:2]}
        return {"total": sum(value_of(i) for i in range(self.n))}


class ObjectsMachine(RuleBasedStateMachine):
    """Real objects in one real store, and two nodes that run in short bursts."""

    objects = Bundle("objects")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="perdure-stateful-"))
        self.nodes = [
            perdure.App(
                store=f"sqlite:///{self.tmp / 'store.db'}?synchronous=normal",
                node_id=node_id,
                key_dir=self.tmp / node_id,
                lease_seconds=LEASE,
                poll_interval=0.01,
            )
            for node_id in ("node-a", "node-b")
        ]
        one_root(self.tmp / "root", self.tmp / "node-a", self.tmp / "node-b")
        self.app = self.nodes[0]
        self.model: dict[str, Expected] = {}
        self.executions: list[tuple[str, str]] = []  # (object id, idempotency key) per run
        self.applied: dict[str, int] = {}  # the side-effect target: first value per key
        # object id -> (what happens: "before"/"after" the effect or "stall", steps to let pass)
        self.armed: dict[str, tuple[str, int]] = {}
        self.violations: list[str] = []
        self.frozen: dict[str, tuple[int, int]] = {}  # terminated: (head seq, executions)
        self.counter = 0
        self.crashes = 0
        self.stalls = 0
        self.fenced = 0  # late executions from stale nodes, refused by their epoch
        self.target_epochs: dict[str, int] = {}
        for app in self.nodes:
            self._register_agents(app)

    # -- agents --------------------------------------------------------------------

    def _register_agents(self, app: perdure.App) -> None:
        machine = self

        async def work(i: int) -> int:
            info = perdure.current_step()
            oid, key = info.object_id, info.idempotency_key
            store = machine.app.store
            current = store.get(oid).epoch  # type: ignore[union-attr]
            done = {(r.body["pos"], r.body["name"]) for r in store.records(oid)
                    if r.kind == Kind.STEP_DONE}
            # Only a stale node (one whose lease was taken over and that has not noticed
            # yet) may run a step that is already done.
            if (info.position, info.name) in done and info.epoch >= current:
                machine.violations.append(f"{key} ran again after its step_done")
            machine.executions.append((oid, key))
            # The target remembers the highest fencing epoch it has seen for the object
            # and refuses writes from below it, as the design asks of side-effect targets.
            if info.epoch < machine.target_epochs.get(oid, 0):
                machine.fenced += 1
                raise StaleWriteError(f"{key}: epoch {info.epoch} is stale")
            machine.target_epochs[oid] = info.epoch
            crash = machine.take_plan(oid)
            if crash == "stall":
                # The node freezes (its event loop blocked, so no lease renewal) past its
                # lease; the other node takes the object over, and this one wakes up stale.
                machine.stalls += 1
                time.sleep(STALL)
            elif crash is not None:
                machine.crashes += 1
            if crash == "before":
                raise SimulatedCrash(key)
            machine.applied.setdefault(key, value_of(i))
            if crash == "after":
                raise SimulatedCrash(key)
            return value_of(i)

        @app.agent(name="chain")
        async def chain(run: perdure.Run, n: int, nap: float) -> dict[str, Any]:
            total = 0
            for i in range(n):
                total += await run.step(work, i, name=f"work{i}")
                if nap and i == 0:
                    await run.sleep(nap)
            return {"total": total}

        @app.agent(name="waiter")
        async def waiter(run: perdure.Run) -> dict[str, Any]:
            first = await run.step(work, 0, name="work0")
            payloads = [await run.wait_for("go")]
            second = await run.step(work, 1, name="work1")
            payloads.append(await run.wait_for("go"))
            return {"total": first + second, "payloads": payloads}

        @app.agent(name="sync_chain")
        def sync_chain(run: SyncRun, n: int) -> dict[str, Any]:
            total = 0
            for i in range(n):
                total += run.step(work, i, name=f"work{i}")
            return {"total": total}

    # -- helpers -------------------------------------------------------------------

    def take_plan(self, oid: str) -> str | None:
        """What this step execution of ``oid`` is armed to do, counting down skipped steps."""
        plan = self.armed.get(oid)
        if plan is None:
            return None
        what, skip = plan
        if skip > 0:
            self.armed[oid] = (what, skip - 1)
            return None
        del self.armed[oid]
        return what

    def _serve(self, seconds: float, nodes: int = 1) -> None:
        """Run ``nodes`` nodes side by side for ``seconds``, then stop them the ordinary way."""

        def serve(app: perdure.App) -> None:
            async def main() -> None:
                asyncio.get_running_loop().set_exception_handler(_quiet_crashes)
                stop = asyncio.Event()
                worker = app.worker(concurrency=8, drain_seconds=3.0)
                task = asyncio.create_task(worker.run(stop))
                await asyncio.sleep(seconds)
                stop.set()
                await task

            asyncio.run(main())

        others = [threading.Thread(target=serve, args=(app,)) for app in self.nodes[1:nodes]]
        for thread in others:
            thread.start()
        try:
            serve(self.nodes[0])
        finally:
            for thread in others:
                thread.join()

    def _status(self, oid: str) -> str:
        row = self.app.store.get(oid)
        assert row is not None, f"object {oid} is lost"
        return row.status

    def _wait_for_leases(self) -> None:
        """Real time passes until no lease is held (crashed nodes' leases lapse)."""
        rows = [self.app.store.get(oid) for oid in self.model]
        expiries = [r.lease_expires for r in rows if r is not None and r.lease_owner]
        if expiries:
            time.sleep(max(0.0, max(e for e in expiries if e is not None) - time.time()) + 0.02)

    def _executions_of(self, oid: str) -> int:
        return sum(1 for owner, _ in self.executions if owner == oid)

    # -- rules ---------------------------------------------------------------------

    @initialize(target=objects, kind=KINDS, n=st.integers(1, 3))
    def first_object(self, kind: str, n: int) -> str:
        """Every run begins with an object, so node rules always have work."""
        return self._start(kind, n)

    @initialize(target=objects, kind=KINDS, n=st.integers(1, 3))
    def second_object(self, kind: str, n: int) -> str:
        """And a second one, so objects share the node."""
        return self._start(kind, n)

    @rule(target=objects, kind=KINDS, n=st.integers(1, 3))
    def start(self, kind: str, n: int) -> str:
        """Start an object of one of the agent shapes; starting an existing id is a no-op."""
        return self._start(kind, n)

    def _start(self, kind: str, n: int) -> str:
        if self.model:
            old = next(iter(self.model))
            before = self.app.get(old).records
            if self.app.get(old).agent == "chain":  # the same agent: that object again
                assert self.app.options(object_id=old).start("chain", 9, 0.0).object_id == old
            else:  # another agent's id: refused
                with pytest.raises(ObjectConflictError):
                    self.app.options(object_id=old).start("chain", 9, 0.0)
            assert self.app.get(old).records == before
        oid = f"obj-{self.counter}"
        self.counter += 1
        if kind == "chain":
            self.app.options(object_id=oid).start("chain", n, 0.0)
        elif kind == "sleepy":
            self.app.options(object_id=oid).start("chain", n, 0.15)
        elif kind == "waiter":
            self.app.options(object_id=oid).start("waiter")
        else:
            self.app.options(object_id=oid).start("sync_chain", n)
        self.model[oid] = Expected("waiter" if kind == "waiter" else "chain", n)
        return oid

    @rule(seconds=st.sampled_from([0.05, 0.1, 0.2]), nodes=st.integers(1, 2))
    def run_node(self, seconds: float, nodes: int) -> None:
        """One node, or two competing for the objects, work a short while and stop cleanly."""
        self._serve(seconds, nodes)

    @rule(oid=objects, when=WHEN)
    def arm_crash(self, oid: str, when: str) -> None:
        """The next step this object runs kills the node, before or after its side effect."""
        self.armed[oid] = (when, 0)

    @rule(when=WHEN, seconds=st.sampled_from([0.05, 0.1]))
    def crash_node(self, when: str, seconds: float) -> None:
        """A node dies in the middle of the next step of every object it runs."""
        for oid in self.model:
            self.armed.setdefault(oid, (when, 0))
        self._serve(seconds)
        self.armed.clear()

    @rule(target=objects, kind=KINDS, n=st.integers(1, 3), when=WHEN, at=st.integers(0, 2))
    def crash_new(self, kind: str, n: int, when: str, at: int) -> str:
        """A new object's node dies in its step number ``at``, before or after the effect."""
        oid = self._start(kind, n)
        self.armed[oid] = (when, at % (2 if kind == "waiter" else n))
        self._serve(0.1 + (0.15 if kind == "sleepy" else 0.0))
        self.armed.pop(oid, None)
        return oid

    @rule(target=objects, kind=st.sampled_from(["chain", "sync"]), n=st.integers(1, 3),
          at=st.integers(0, 2))
    def stall_new(self, kind: str, n: int, at: int) -> str:
        """A node freezes mid-step past its lease while a second node runs: fencing holds."""
        oid = self._start(kind, n)
        self.armed[oid] = ("stall", at % n)
        self._serve(STALL + 0.3, nodes=2)
        self.armed.pop(oid, None)
        return oid

    @rule(oid=objects, burst=st.lists(
        st.tuples(st.sampled_from(["go", "go", "noise"]), st.integers(0, 99),
                  st.sampled_from([None, None, "k1", "k2"])),
        min_size=1, max_size=3,
    ))
    def send(self, oid: str, burst: list[tuple[str, int, str | None]]) -> None:
        """Send events; a reused dedupe key is refused, and a terminated object refuses all."""
        exp = self.model[oid]
        for name, payload, dedupe in burst:
            if self._status(oid) in TERMINAL:
                with pytest.raises(ObjectTerminatedError):
                    self.app.send(oid, name, payload, dedupe_key=dedupe)
                continue
            accepted = self.app.send(oid, name, payload, dedupe_key=dedupe)
            assert accepted == (dedupe is None or dedupe not in exp.dedupe_keys)
            if dedupe is not None:
                exp.dedupe_keys.add(dedupe)
            if accepted and name == "go":
                exp.go_payloads.append(payload)

    @rule(oid=objects, action=st.sampled_from(["pause", "resume"]))
    def pause_or_resume(self, oid: str, action: str) -> None:
        """Pause or resume; a terminated object refuses with ObjectTerminatedError."""
        self._control(oid, action)

    @rule(oid=objects)
    def cancel(self, oid: str) -> None:
        """Cancel; the object ends cancelled, unless it had already terminated."""
        self._control(oid, "cancel")

    def _control(self, oid: str, action: str) -> None:
        exp = self.model[oid]
        call = {"pause": self.app.pause, "resume": self.app.resume, "cancel": self.app.cancel}
        if self._status(oid) in TERMINAL:
            with pytest.raises(ObjectTerminatedError):
                call[action](oid)
            return
        info = call[action](oid)
        assert info.object_id == oid
        if action == "pause":
            exp.paused = True
            assert info.status == perdure.Status.PAUSED
        elif action == "resume":
            exp.paused = False
        else:
            exp.cancelled = True

    @rule(seconds=st.sampled_from([0.05, 0.2, None]))
    def clock_moves(self, seconds: float | None) -> None:
        """Real time passes: sleep timers come due, or (None) every crashed lease lapses."""
        if seconds is None:
            self._wait_for_leases()
        else:
            time.sleep(seconds)

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def memory_is_sound(self) -> None:
        """Chains verify; steps are done once; stale nodes never write; ends are final and right."""
        assert not self.violations, self.violations
        listed = {info.object_id for info in self.app.list(limit=10_000)}
        assert listed == set(self.model), "objects lost or appeared from nowhere"
        for oid, exp in self.model.items():
            row = self.app.store.get(oid)
            assert row is not None, f"object {oid} is lost"
            report = self.app.verify(oid)
            assert report.ok, str(report)
            records = self.app.store.records(oid)
            assert records[0].kind == Kind.INSTANTIATED
            done = [(r.body["pos"], r.body["name"]) for r in records if r.kind == Kind.STEP_DONE]
            assert len(done) == len(set(done)), f"{oid}: a step is done twice: {done}"
            for rec in records:
                if rec.kind == Kind.STEP_DONE:
                    key = f"{oid}/{rec.body['pos']}/{rec.body['name']}"
                    assert self.applied.get(key) == rec.body["result"], key
            assert not row.parked, f"{oid} parked: {row.note}"
            failed = [r.body for r in records if r.kind == Kind.STEP_FAILED]
            assert not failed, f"{oid}: a refused stale write reached memory: {failed}"
            ends = [r for r in records if r.kind == Kind.TERMINATED]
            assert len(ends) <= 1
            assert (row.status in TERMINAL) == bool(ends), (oid, row.status)
            if not ends:
                continue
            assert records[-1].kind == Kind.TERMINATED
            now = (row.head_seq, self._executions_of(oid))
            assert self.frozen.setdefault(oid, now) == now, f"{oid} changed after terminating"
            body = ends[0].body
            if exp.cancelled:
                assert body["outcome"] == "cancelled", body
            else:
                assert body["outcome"] == "completed", body
                assert body["result"] == exp.result()
                assert self.app.result_of(oid) == exp.result()

    # -- the end: nothing may be lost ------------------------------------------------

    def teardown(self) -> None:
        """Release every hold, let the node finish, and check every object terminated right."""
        try:
            self._finish_everything()
        finally:
            for app in self.nodes:
                app.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _finish_everything(self) -> None:
        self.armed.clear()
        for oid, exp in self.model.items():
            if self._status(oid) in TERMINAL:
                continue
            if exp.paused:
                self.app.resume(oid)
                exp.paused = False
            while exp.kind == "waiter" and len(exp.go_payloads) < 2:
                assert self.app.send(oid, "go", 1000 + len(exp.go_payloads))
                exp.go_payloads.append(1000 + len(exp.go_payloads))
        give_up = time.monotonic() + 8.0
        while True:
            open_objects = [oid for oid in self.model if self._status(oid) not in TERMINAL]
            if not open_objects:
                break
            assert time.monotonic() < give_up, f"objects never finished: {open_objects}"
            self._wait_for_leases()
            self._serve(0.25, nodes=2)
        self.memory_is_sound()
        outcomes = sorted(self._status(oid) for oid in self.model)
        event(f"objects: {len(outcomes)}, cancelled: {outcomes.count('cancelled')}")
        event(f"crashes: {min(self.crashes, 3)}{'+' if self.crashes > 3 else ''}")
        event(f"stalls: {min(self.stalls, 2)}, fenced: {min(self.fenced, 1)}")


ObjectsMachine.TestCase.settings = settings(
    max_examples=4 * SCALE,
    stateful_step_count=15 * SCALE,
    deadline=None,
    database=None,
    derandomize=SCALE == 1,
    suppress_health_check=[HealthCheck.too_slow],
)
TestObjectsMachine = pytest.mark.timeout(240 * SCALE * SCALE)(ObjectsMachine.TestCase)


class SoakMachine(ObjectsMachine):
    """The same machine, run longer on fresh random examples (``-m slow``)."""


SoakMachine.TestCase.settings = settings(
    ObjectsMachine.TestCase.settings,
    max_examples=30 * SCALE,
    stateful_step_count=30,
    derandomize=False,
)
TestObjectsMachineSoak = pytest.mark.slow(
    pytest.mark.timeout(600 * SCALE)(SoakMachine.TestCase)
)
