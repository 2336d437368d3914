"""``Environment``: an App's agents run inside a test, on a store and a clock of their own.

``Environment(app)`` copies ``app``'s agents, tools, queries and policy into a new App
(``env.app``) on an in-memory store (or a SQLite file in a temporary folder), with a key
folder of its own there and a ``VirtualClock``, and runs one worker of it on a thread
of its own for the ``with`` block (``async with`` too). The App you gave is not touched.

Time skips: when nothing in the environment can move (no object running or due now)
and an object is dormant on a timer (a sleep, a wait's timeout, an approval's deadline,
a step's retry, the object's deadline), ``run_until_complete`` (and
``handle.result()`` of the environment's handles) moves the clock to the earliest due
time, so an hour's sleep takes no time; ``run`` does the same until the object ends or
waits for what only the test can give (an event or an answer, a person's decision,
a resume), and says what (a ``Summary``). ``skip(seconds)`` moves the clock by hand.
Everything the App and its worker stamp or compare with the time reads that clock:
records' timestamps, ``run.now()``, timers, deadlines, approvals' deadlines, leases;
nothing else in the process does (``time`` is not patched).

The helpers answer questions (``answer``) and decide on tool calls (``approve``,
``reject``) through the App's own API, signed by an identity of the environment's key
folder: by default the environment's node, or the first approver the proposal names
when the policy names some (``by=`` chooses one, to test who may decide).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perdure.app import App
from perdure.core.approvals import PendingApproval, pending_in
from perdure.core.lifecycle import TERMINAL_STATUSES
from perdure.core.questions import Question, pending_questions
from perdure.engine.run import CHILD_EVENT
from perdure.engine.worker import Worker
from perdure.errors import (
    ApprovalError,
    BlockedError,
    ConfigurationError,
    ResultTimeoutError,
)
from perdure.handle import Handle
from perdure.keys.client import lookup_id
from perdure.starting import Starter
from perdure.stores import Store, open_store
from perdure.stores.base import ObjectRow
from perdure.testing.clock import VirtualClock
from perdure.testing.history import History
from perdure.testing.summary import Summary, summarize

__all__ = ["EnvHandle", "Environment"]

# The environment's only node holds what it runs for as long as it runs it: a skip of the
# clock never ends a lease (virtual seconds; renewed every third of it, so never).
LEASE_SECONDS = 10 * 365 * 86400.0
DRAIN_SECONDS = 5.0  # how long closing lets steps still running finish
STORES = ("memory", "sqlite")


class EnvHandle(Handle):
    """A ``Handle`` of an object in an ``Environment``: ``result()`` runs the environment
    to the object's end, skipping time (``Environment.run_until_complete``); ``run()``
    to its end or its next wait (``Environment.run``). Everything else is ``Handle``'s."""

    def __init__(self, env: Environment, object_id: str, *, created: bool = False,
                 differs: str | None = None) -> None:
        super().__init__(env.app, object_id, created=created, differs=differs)
        self.env = env

    def __repr__(self) -> str:
        return f"EnvHandle({self.object_id!r})"

    def result(self, timeout: float | None = None, *, poll: float = 0.05) -> Any:
        """The object's result once it ended, skipping time while it sleeps (see
        ``Environment.run_until_complete``); ``timeout`` is real seconds (default: the
        environment's). ``poll`` is not used (the environment watches the store)."""
        return self.env.run_until_complete(self, timeout=timeout)

    async def aresult(self, timeout: float | None = None) -> Any:
        """``result`` for async code (it waits on a thread, not on the loop)."""
        return await self.env.arun_until_complete(self, timeout=timeout)

    def run(self, timeout: float | None = None) -> Summary:
        """See ``Environment.run``."""
        return self.env.run(self, timeout=timeout)

    async def arun(self, timeout: float | None = None) -> Summary:
        """See ``Environment.arun``."""
        return await self.env.arun(self, timeout=timeout)

    def summary(self) -> Summary:
        """Where the object stands now, without running anything."""
        return self.env.summary(self)


class _EnvApp(App):
    """The environment's App: its handles are ``EnvHandle``s."""

    def __init__(self, env: Environment, **settings: Any) -> None:
        super().__init__(**settings)
        self._env = env

    def _start(self, agent: Callable[..., Any] | str, args: tuple[Any, ...],
               kwargs: dict[str, Any], options: Starter | None) -> EnvHandle:
        made = super()._start(agent, args, kwargs, options)
        return EnvHandle(self._env, made.object_id, created=made.created, differs=made.differs)

    def handle(self, object_id: str) -> EnvHandle:
        self.get(object_id)
        return EnvHandle(self._env, object_id)

    def fork(self, object_id: str, *, at: int, new_id: str | None = None) -> EnvHandle:
        made = super().fork(object_id, at=at, new_id=new_id)
        return EnvHandle(self._env, made.object_id, created=made.created)


Target = Handle | str


def _id(target: Target) -> str:
    if isinstance(target, Handle):
        return target.object_id
    if not isinstance(target, str):
        raise ConfigurationError(f"an object is given by its handle or its id, not "
                                 f"{type(target).__name__}")
    return lookup_id(target)


class Environment:
    """``app``'s agents, run in a test on a store and a clock of their own (see the module).

    ``store`` is ``"memory"`` (default) or ``"sqlite"`` (a file in the temporary folder,
    ``path``); ``start_time`` where the clock begins (seconds since the epoch; default: now);
    ``node_id`` the name the environment's node and its default approver act under;
    ``timeout`` the real seconds ``run`` and ``run_until_complete`` wait at most for
    anything to happen before ``ResultTimeoutError`` (a step that never ends, say).

    Use it as a context manager (``with Environment(app) as env:`` or ``async with``),
    or call ``open()`` and ``close()``.
    """

    def __init__(self, app: App, *, store: str = "memory", start_time: float | None = None,
                 node_id: str = "perdure-test", concurrency: int = 16,
                 timeout: float = 60.0) -> None:
        if not isinstance(app, App):
            raise ConfigurationError(f"Environment takes a perdure.App, not "
                                     f"{type(app).__name__}")
        if store not in STORES:
            raise ConfigurationError(f"an environment's store is 'memory' or 'sqlite', not "
                                     f"{store!r} (its clock is its own: a shared store's "
                                     "workers would not follow it)")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"timeout is a positive number of seconds, not "
                                     f"{timeout!r}")
        self.source = app
        #: The environment's time; every timer, deadline and timestamp follows it.
        self.clock = VirtualClock(start_time)
        self.timeout = float(timeout)
        #: The temporary folder of the store's file (``sqlite``) and the key folder; it
        #: is removed by ``close``.
        self.path: Path | None = None
        self._store_kind = store
        self._node_id = node_id
        self._concurrency = concurrency
        self._app: _EnvApp | None = None
        self._store: Store | None = None
        self._worker: Worker | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._deciders: dict[str, App] = {}

    # -- starting and stopping ------------------------------------------------------

    def open(self) -> Environment:
        """Make the store, the key folder and the App, and start the worker (what
        ``with`` does)."""
        if self._app is not None:
            raise ConfigurationError("this environment is open already")
        self.path = Path(tempfile.mkdtemp(prefix="perdure-test-"))
        try:
            url = ("memory:" if self._store_kind == "memory"
                   else f"sqlite:///{self.path / 'env.db'}")
            self._store = open_store(url)
            source = self.source
            app = _EnvApp(self, store=self._store, key_dir=self.path / "keys",
                          node_id=self._node_id, policy=source.policy,
                          lease_seconds=LEASE_SECONDS, poll_interval=0.01,
                          capabilities=source.capabilities, prices=source.prices,
                          clock=self.clock)
            app._adopt(source)
            self._app = app
            self._worker = app.worker(concurrency=self._concurrency,
                                      drain_seconds=DRAIN_SECONDS)
            started = threading.Event()
            self._thread = threading.Thread(target=self._serve,
                                            args=(self._worker, started),
                                            name="perdure-test-worker", daemon=True)
            self._thread.start()
            started.wait()
            if self._failure is not None:
                raise self._failure
        except BaseException:
            self.close()
            raise
        return self

    def _serve(self, worker: Worker, started: threading.Event) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            started.set()
            await worker.run(self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - said by close() and every wait
            self._failure = exc
        finally:
            started.set()

    def close(self) -> None:
        """Stop the worker (steps still running get 5 seconds to finish), close the App
        and the store and remove the temporary folder (opened again, it starts on a new,
        empty store). Raises what stopped the worker, if anything did."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop ended already
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout=DRAIN_SECONDS + 30)
        for decider in self._deciders.values():
            decider.close()
        self._deciders.clear()
        if self._app is not None:
            self._app.close()
        if self._store is not None:
            self._store.close()
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
        self._thread = self._loop = self._stop = None
        self._app = self._store = self._worker = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def __enter__(self) -> Environment:
        return self.open()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Environment:
        return await asyncio.to_thread(self.open)

    async def __aexit__(self, *_exc: object) -> None:
        await asyncio.to_thread(self.close)

    @property
    def app(self) -> App:
        """The environment's App (its store, keys and clock; ``app``'s agents): start,
        send to, query and inspect objects through it. Its handles are ``EnvHandle``s."""
        if self._app is None:
            raise ConfigurationError("the environment is not started: use "
                                     "`with Environment(app) as env:` (or env.open())")
        return self._app

    @property
    def worker(self) -> Worker:
        """The environment's worker (its node: ``worker.node``)."""
        if self._worker is None:
            raise ConfigurationError("the environment is not started")
        return self._worker

    # -- the clock ------------------------------------------------------------------

    def now(self) -> float:
        """The environment's time (seconds since the epoch)."""
        return self.clock()

    def skip(self, seconds: float, *, timeout: float | None = None) -> float:
        """Move the clock ``seconds`` ahead and let everything due by then run until
        nothing more can move without more time or the test; the time after the skip."""
        now = self.clock.skip(seconds)
        self.worker.wake()
        self.settle(timeout=timeout)
        return now

    def settle(self, *, timeout: float | None = None) -> None:
        """Wait until nothing in the environment is running or due now (without moving
        the clock); ``ResultTimeoutError`` after ``timeout`` real seconds."""
        limit = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            self._check_worker()
            _, busy, _ = self._look()
            if not busy:
                return
            if time.monotonic() >= limit:
                raise ResultTimeoutError(f"the environment was still busy after "
                                         f"{self.timeout if timeout is None else timeout}s")
            time.sleep(0.005)

    # -- starting objects ------------------------------------------------------------

    def start(self, agent: Callable[..., Any] | str, /, *args: Any,
              **kwargs: Any) -> EnvHandle:
        """``app.start`` in the environment: a new object running ``agent(*args,
        **kwargs)`` (see ``App.start``; ``options`` for its id, deadline, labels...)."""
        handle = self.app.start(agent, *args, **kwargs)
        assert isinstance(handle, EnvHandle)
        return handle

    def options(self, **options: Any) -> Starter:
        """``app.options`` in the environment: its ``start`` gives an ``EnvHandle``."""
        return self.app.options(**options)

    def handle(self, object_id: str) -> EnvHandle:
        """An ``EnvHandle`` of an object of the environment."""
        handle = self.app.handle(object_id)
        assert isinstance(handle, EnvHandle)
        return handle

    # -- running --------------------------------------------------------------------

    def summary(self, target: Target) -> Summary:
        """Where the object stands now, without running anything or moving the clock."""
        return summarize(self.app, _id(target))

    def run(self, target: Target, *, timeout: float | None = None) -> Summary:
        """Run until the object ends, or waits for what only the test can give: an event
        (an answer to its question), a person's decision on a tool call, a resume, a
        retry, or children that wait for such things. Sleeps, retries' pauses and the
        timers of its children are skipped; a wait that has a timeout (and an approval
        with a deadline) is returned as it is, to be answered, or skipped with ``skip``
        or ``run_until_complete``. What it waits for, or how it ended, is the
        ``Summary``.

        ``ResultTimeoutError`` if something kept running (or stayed due) for ``timeout``
        real seconds (default: the environment's)."""
        return self._drive(_id(target), finish=False, timeout=timeout)

    def run_until_complete(self, target: Target, *, timeout: float | None = None) -> Any:
        """Run until the object ends, skipping every timer on the way (its waits'
        timeouts and approvals' deadlines too), and return its result as
        ``Handle.result`` does: ``AgentFailedError``, ``AgentCancelledError``,
        ``AgentParkedError``. ``BlockedError`` (with the ``Summary``) when it waits for
        what only the test can give and no timer is left; ``ResultTimeoutError`` as for
        ``run``."""
        object_id = _id(target)
        self._drive(object_id, finish=True, timeout=timeout)
        return Handle(self.app, object_id).result(timeout=5.0)

    async def arun(self, target: Target, *, timeout: float | None = None) -> Summary:
        """``run`` for async code (it waits on a thread, not on the loop)."""
        return await asyncio.to_thread(self.run, target, timeout=timeout)

    async def arun_until_complete(self, target: Target, *,
                                  timeout: float | None = None) -> Any:
        """``run_until_complete`` for async code (it waits on a thread)."""
        return await asyncio.to_thread(self.run_until_complete, target, timeout=timeout)

    def _check_worker(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"the environment's worker stopped: {self._failure!r}"
                               ) from self._failure

    def _claimable(self, row: ObjectRow) -> bool:
        worker = self.worker
        return row.cancel_requested or (
            f"{row.agent}@{row.agent_version}" in worker.serves
            and all(need in worker.capabilities for need in row.requires)
            and worker.owner not in row.avoid)

    def _look(self) -> tuple[dict[str, ObjectRow], bool, float | None]:
        """The rows of the objects that have not ended, whether anything runs or is due
        now (that this node can take), and the earliest due time after now."""
        node = self.worker.node
        busy = bool(node.active)
        now = self.clock()
        rows: dict[str, ObjectRow] = {}
        due: float | None = None
        for row in self.app.store.list(limit=1_000_000):
            if row.status in TERMINAL_STATUSES:
                continue
            rows[row.object_id] = row
            if row.parked or (row.paused and not row.cancel_requested):
                continue
            if row.lease_owner is not None and (row.lease_expires or 0.0) > now:
                busy = True
            elif row.ready_at is None:
                continue
            elif row.ready_at <= now:
                busy = busy or self._claimable(row)
            elif due is None or row.ready_at < due:
                due = row.ready_at
        return rows, busy or bool(node.active), due

    def _drive(self, object_id: str, *, finish: bool, timeout: float | None) -> Summary:
        app = self.app
        app.get(object_id, explain=False)  # ObjectNotFoundError
        seconds = self.timeout if timeout is None else timeout
        limit = time.monotonic() + seconds
        changed = threading.Event()
        unsubscribe = app.store.subscribe_results(lambda _oid: changed.set(), changes=True)
        try:
            while True:
                changed.clear()
                self._check_worker()
                rows, busy, due = self._look()
                row = rows.get(object_id)
                if row is None or row.parked:  # ended (or parked: a person must act)
                    return summarize(app, object_id)
                if not busy:
                    outside = ((row.paused and not row.cancel_requested)
                               or (row.waiting_event is not None
                                   and row.waiting_event != CHILD_EVENT))
                    if outside and not finish:
                        return summarize(app, object_id)
                    if due is None:
                        summary = summarize(app, object_id, runnable=False)
                        if not finish:
                            return summary
                        raise BlockedError(
                            object_id, f"object {object_id!r} cannot end: {summary}; no "
                            "timer is left in the environment (answer it: env.answer, "
                            "env.approve, handle.send, handle.resume)", summary)
                    self.clock.skip_to(due)
                    self.worker.wake()
                    continue
                if time.monotonic() >= limit:
                    info = app.get(object_id, explain=False)
                    raise ResultTimeoutError(
                        f"object {object_id!r} is still {info.status} after {seconds}s "
                        f"(real time; the environment's clock skipped "
                        f"{self.clock.skipped:g}s); something in the environment keeps "
                        "running or stays due")
                changed.wait(0.01)
        finally:
            if unsubscribe is not None:
                unsubscribe()

    # -- answering and deciding --------------------------------------------------------

    def questions(self, target: Target) -> list[Question]:
        """The questions the object asks now (its ``run.wait_for`` waits), oldest first."""
        object_id = _id(target)
        info = self.app.get(object_id, explain=False)
        return pending_questions(self.app.history(object_id, opened=True), info.agent)

    def answer(self, target: Target, payload: Any = None, *, event: str | None = None,
               dedupe_key: str | None = None) -> Question | None:
        """Answer the object's question: send ``payload`` as the event it waits for
        (``App.send``). With several open questions, ``event`` chooses one; with
        ``event`` given, the event is sent even before the object asks (events are kept
        until waited for). The question answered, or ``None`` if it did not ask yet.
        ``ConfigurationError`` when it asks nothing and no ``event`` is given."""
        object_id = _id(target)
        asked = self.questions(object_id)
        chosen = next((q for q in asked if event is None or q.event == event), None)
        if chosen is None and event is None:
            summary = summarize(self.app, object_id)
            raise ConfigurationError(f"object {object_id!r} asks nothing now ({summary}); "
                                     "run it to its question first (env.run), or name "
                                     "the event")
        self.app.send(object_id, chosen.event if chosen is not None else str(event), payload,
                      dedupe_key=dedupe_key)
        return chosen

    def approvals(self, target: Target) -> list[PendingApproval]:
        """The object's tool calls waiting for a person now, oldest first."""
        object_id = _id(target)
        return pending_in(self.app.history(object_id, opened=True))

    def identity(self, name: str) -> App:
        """An App of the environment acting as ``name``: its key certified under that
        name by the environment's root (an approver the policy names, say)."""
        if name == self.app.node_id:
            return self.app
        decider = self._deciders.get(name)
        if decider is None:
            decider = self._deciders[name] = self.app.with_settings(node_id=name)
        return decider

    def approve(self, target: Target, proposal: str | None = None, *,
                edit: Mapping[str, Any] | None = None, by: str | None = None
                ) -> PendingApproval:
        """Approve the object's tool call ``proposal`` (default: the only or first one
        waiting), with ``edit`` as new arguments if given (``App.approve``). Signed as
        ``by``; by default as the environment's node, or the first approver the
        proposal names if the policy names approvers and not it. ``ApprovalError`` when
        no such call waits, or ``by`` may not decide on it."""
        pending = self._proposal(_id(target), proposal)
        decider = self.identity(by if by is not None else self._approver(pending))
        return decider.approve(pending.object_id, pending.proposal_id, edit=edit)

    def reject(self, target: Target, proposal: str | None = None, *, reason: str,
               by: str | None = None) -> PendingApproval:
        """Reject the object's tool call (as ``approve`` finds it and signs); the model is
        told ``reason``."""
        pending = self._proposal(_id(target), proposal)
        decider = self.identity(by if by is not None else self._approver(pending))
        return decider.reject(pending.object_id, pending.proposal_id, reason=reason)

    def _approver(self, pending: PendingApproval) -> str:
        if not pending.approvers or self.app.node_id in pending.approvers:
            return self.app.node_id
        return pending.approvers[0]

    def _proposal(self, object_id: str, proposal: str | None) -> PendingApproval:
        waiting = self.approvals(object_id)
        for item in waiting:
            if proposal is None or item.proposal_id == proposal:
                return item
        if not waiting:
            raise ApprovalError(f"object {object_id!r} has no tool call waiting for a "
                                f"person ({summarize(self.app, object_id)}); run it to its "
                                "approval first (env.run)")
        raise ApprovalError(f"object {object_id!r} has no proposal {proposal!r} waiting; "
                            f"waiting: {', '.join(p.proposal_id for p in waiting)}")

    # -- histories ------------------------------------------------------------------

    def history(self, target: Target) -> History:
        """The object's memory as a ``History`` (verified first), to write to a file
        and replay later (``Replayer``)."""
        return History.of(self.app, _id(target))

    def export(self, target: Target, path: str | Path) -> Path:
        """Write the object's history to ``path`` (JSON; see ``History``); the path."""
        return self.history(target).write(path)
