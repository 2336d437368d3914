"""``Run``: what an agent holds while it runs, replaying memory and recording new work.

Every command an agent issues (step, sleep, wait_for, now, uuid, random) takes
the next *position*. On resume the agent function runs again from the top; a
command whose position already has records returns what they say without
doing the work again. A command that does not match what its position
recorded parks the object with a non-determinism record.
"""

from __future__ import annotations

import asyncio
import inspect
import random as _random
import time
import uuid as _uuid
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from time import monotonic
from typing import Any, TypeVar, overload

from perdure.core.backoff import ErrorClass, Failure, RetryPolicy, classify, next_delay
from perdure.core.codec import decode, detached, encode
from perdure.core.intent import Context, Intent
from perdure.core.names import check_name, check_object_id
from perdure.core.records import Kind, Record, RecordDraft, step_done_bytes
from perdure.engine.context import StepInfo
from perdure.engine.failures import error_body, rebuild_error
from perdure.engine.journal import Journal
from perdure.engine.verifier import EventCheck
from perdure.errors import (
    CancelRequestedError,
    CannotDo,
    ChildFailedError,
    LeaseLostError,
    NonDeterminismError,
    ObjectConflictError,
    SerializationError,
    StepInDoubtError,
)
from perdure.stores.base import Event

__all__ = [
    "CHILD_EVENT",
    "ChildHandle",
    "Park",
    "Run",
    "Suspend",
    "SyncRun",
]

CHILD_EVENT = "perdure:child"  # a child's terminal signal in its parent's inbox

Spawn = Callable[[Any, tuple[Any, ...], dict[str, Any], str, Context], Awaitable[str]]


@dataclass
class _Branch:
    """A branch of ``run.gather``: its commands take positions under ``prefix``."""

    prefix: str
    counter: int = 0


_branch: ContextVar[_Branch | None] = ContextVar("perdure_branch", default=None)


def _top(position: int | str) -> int:
    """The top-level command position of a (possibly branch) position ``3`` / ``"3.1.0"``."""
    return position if isinstance(position, int) else int(str(position).split(".", 1)[0])


def child_finished_body(payload: bytes, event_id: int, digest: str | None = None
                        ) -> dict[str, Any] | None:
    """The ``child_finished`` record body for a child's terminal signal, or ``None``."""
    try:
        body = decode(payload)
    except ValueError:
        return None
    if not isinstance(body, dict) or "child_id" not in body:
        return None
    extra: dict[str, Any] = {"event_id": event_id}
    if digest:
        extra["event_hash"] = digest
    return {**body, **extra}


T = TypeVar("T")

DEFAULT_RETRY = RetryPolicy()


class Suspend(BaseException):
    """Unwind the agent: the object goes dormant (or paused) and the node lets it go."""

    def __init__(
        self,
        drafts: Sequence[RecordDraft],
        *,
        ready_at: float | None,
        waiting_event: str | None = None,
        status: str = "dormant",
        reason: str = "",
        children: Sequence[str] = (),
        consume_event_ids: Sequence[int] = (),
        requires: tuple[str, ...] | None = None,
        avoid_node: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.drafts = list(drafts)
        self.ready_at = ready_at
        self.waiting_event = waiting_event
        self.status = status
        self.reason = reason
        self.children = tuple(children)
        self.consume_event_ids = tuple(consume_event_ids)
        self.requires = requires
        self.avoid_node = avoid_node


class Park(BaseException):
    """Unwind the agent and park the object: a person must look at it.

    ``record`` is what memory says about why (a non-determinism record, or a park
    record naming the step that kept killing its workers); ``error`` says it in words.
    """

    def __init__(self, error: Exception, record: RecordDraft | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.record = record


class DeadlineExceeded(BaseException):
    """The intent's deadline passed while the agent ran."""


_CHILD_FINISHED = Kind.CHILD_FINISHED.value
_CAPABILITY_MISSING = Kind.CAPABILITY_MISSING.value
_INSTANTIATED = Kind.INSTANTIATED.value
_STEP_DONE = Kind.STEP_DONE.value
_SPECIAL_KINDS = frozenset((_CHILD_FINISHED, _CAPABILITY_MISSING, _INSTANTIATED))
_EVENT_RECEIVED = Kind.EVENT_RECEIVED.value
_INTENT_REFINED = Kind.INTENT_REFINED.value
FLAGS_FRESH = 0.005  # seconds: a step starts only on cancel/pause flags at most this old


_SCALARS = (int, float, str, bool, type(None))  # what JSON gives back as it was given


def _step_name(fn: Callable[..., Any]) -> str:
    """The name a step of ``fn`` is recorded under when the call gives none."""
    opts: Mapping[str, Any] = getattr(fn, "__perdure_step__", {})
    return str(opts.get("name") or _qualname(fn))


def _qualname(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__perdure_name__", None) or getattr(fn, "__qualname__", None)
    return str(name or repr(fn))


class Run:
    """The handle an ``async def`` agent receives. Plain ``def`` agents get ``SyncRun``."""

    def __init__(
        self,
        *,
        journal: Journal,
        intent: Intent,
        context: Context,
        records: Sequence[Record],
        load_events: Callable[[], Awaitable[list[Event]]],
        pending_events: Sequence[Event] = (),
        step_executor: Callable[..., Awaitable[Any]],
        clock: Callable[[], float] = time.time,
        spawn: Spawn | None = None,
        capabilities: frozenset[str] = frozenset(),
        check_event: Callable[[Event], EventCheck] | None = None,
        refresh_flags: Callable[[], Awaitable[None]] | None = None,
        crashes: int = 0,
        max_crashes: int | None = None,
    ) -> None:
        self._journal = journal
        self._check_event = check_event
        self._refresh_flags = refresh_flags
        self._crashes = crashes
        # Workers died in a row at this point often enough: the next new step parks.
        self._poisoned_at = max_crashes is not None and crashes >= max_crashes
        self._patches: dict[str, bool] = {}  # patch name -> the path this object takes
        self._intent = intent
        self._context = context
        self._load_events = load_events
        self._pending: Sequence[Event] = pending_events
        self._step_executor = step_executor
        self._clock = clock
        self._spawn = spawn
        self._capabilities = capabilities
        self._pos = 0
        self._history: dict[int | str, list[Record]] = {}
        self._done: dict[int | str, Record] = {}
        self._children: dict[str, dict[str, Any]] = {}
        self._refusals: set[str] = set()
        self._last_fn: Any = None  # the function of the last step without a name, and
        self._last_name = ""  # the name it is recorded under
        # One pass over memory (10,000 records on a long resume): index by position.
        # A position whose only record is a step's result (most of a long memory) is
        # kept in ``_done``, the rest in ``_history``; replay of such a step takes the
        # result from there in a few lookups.
        history = self._history
        done = self._done
        top = -1
        rerouted = False
        refined: list[str] = []
        self._refined = refined
        special = _SPECIAL_KINDS
        step_done = _STEP_DONE
        for rec in records:
            kind = rec.kind
            body = rec.body
            if kind in special:
                if kind == _CHILD_FINISHED:
                    self._children[str(body["child_id"])] = body
                elif kind == _CAPABILITY_MISSING:
                    self._refusals.add(str(body.get("refusal")))
                    rerouted = True
                continue
            pos = body.get("pos")
            if type(pos) is int:
                if pos > top:
                    top = pos
            elif type(pos) is str:
                top = max(top, _top(pos))
            else:
                if kind == _INTENT_REFINED and body.get("event_hash"):  # from outside
                    refined.append(str(body["event_hash"]))
                continue
            recs = history.get(pos)
            if recs is not None:
                recs.append(rec)
            elif pos in done:  # a second record where a step's result stood alone
                history[pos] = [done.pop(pos), rec]
            elif kind == step_done and body.get("cmd") == "step":
                done[pos] = rec
            else:
                history[pos] = [rec]
        self._max_recorded = top
        self._started_here: set[int | str] = set()
        self._rerouted = rerouted
        self._consumed: set[int] = set()
        self._digests: set[str] | None = None
        #: Events refused on this claim: ``(event_id, name, reason)`` (the node logs them).
        self.refused: list[tuple[int, str, str]] = []
        self.cancel_requested = False
        self.pause_requested = False
        self.release_requested = False
        self.lease_lost = False

    # -- what the agent can read ---------------------------------------------

    @property
    def object_id(self) -> str:
        """This object's id."""
        return self._context.object_id

    @property
    def intent(self) -> Intent:
        """The current intent (after any refinements)."""
        return self._intent

    @property
    def context(self) -> Context:
        """Identity, lineage and labels."""
        return self._context

    @property
    def epoch(self) -> int:
        """The fencing epoch this node holds the object with."""
        return self._journal.epoch

    @property
    def replaying(self) -> bool:
        """True while the agent is still re-running recorded commands."""
        return self._pos <= self._max_recorded

    # -- bookkeeping -----------------------------------------------------------

    def _boundary(self) -> None:
        if self.lease_lost:
            raise LeaseLostError(f"object {self.object_id!r}: lease lost")
        if self.cancel_requested or self._journal.cancel_seen:
            raise CancelRequestedError(f"object {self.object_id!r} was cancelled")
        deadline = self._intent.deadline
        if deadline is not None and self._clock() >= deadline:
            raise DeadlineExceeded(f"deadline {deadline} passed")
        if self.pause_requested:
            raise Suspend([], ready_at=self._clock(), status="paused", reason="paused")
        if self.release_requested:
            raise Suspend([], ready_at=self._clock(), status="ready", reason="node stopping")

    def _key(self, *, consume: bool = True) -> int | str:
        branch = _branch.get()
        if branch is None:
            key: int | str = self._pos
            if consume:
                self._pos += 1
        else:
            key = f"{branch.prefix}.{branch.counter}"
            if consume:
                branch.counter += 1
        return key

    def _recorded(self, pos: int | str) -> Sequence[Record]:
        """What memory holds for position ``pos`` (empty if nothing)."""
        recs = self._history.get(pos)
        if recs is not None:
            return recs
        rec = self._done.get(pos)
        return () if rec is None else (rec,)

    def _take(self, cmd: str, name: str | None) -> tuple[int | str, Sequence[Record]]:
        """The next position and what memory holds for it, which must be this command."""
        if _branch.get() is None:  # the main line (``_key`` without its call: every step)
            pos: int | str = self._pos
            self._pos += 1
        else:
            pos = self._key()
        recs = self._recorded(pos)
        if not recs:
            return pos, ()
        first = recs[0].body
        rec_cmd, rec_name = first.get("cmd"), first.get("name")
        if rec_cmd != cmd or (name is not None and rec_name != name):
            raise Park(
                NonDeterminismError(
                    pos, f"{rec_cmd}({rec_name!r})", f"{cmd}({name!r})"
                )
            )
        return pos, recs

    def patched(self, name: str) -> bool:
        """``True`` where code behind ``if run.patched(name):`` should run.

        Decided once per object, at the first call of ``name``: an object that reaches
        it as new work takes the patched path (and records that it did); an object
        whose memory was written before the patch (memory holds something else at that
        point) keeps the old path, at that call and at every later call of the same
        name. So adding a patched block never breaks a running object, and no object
        mixes old and new paths. Retire a patch with ``deprecate_patch``.
        """
        key = self._key(consume=False)
        recs = self._recorded(key)
        marked = bool(recs) and recs[0].kind == Kind.PATCHED and recs[0].body.get("name") == name
        decided = self._patches.get(name)
        if marked:
            self._key()
            self._patches.setdefault(name, True)
            return True  # memory says this call took the new path: replay it
        if decided is not None:
            if decided and not recs:
                self._key()  # new work on the new path: recorded as every call before
                self._journal.defer(RecordDraft(Kind.PATCHED, {"pos": key, "cmd": "patch",
                                                               "name": name}))
            return decided
        if recs:
            self._patches[name] = False  # memory from before the patch: the old path
            return False
        self._patches[name] = True
        self._key()
        self._journal.defer(RecordDraft(Kind.PATCHED, {"pos": key, "cmd": "patch", "name": name}))
        return True

    def deprecate_patch(self, name: str) -> None:
        """Say that only the new path of patch ``name`` is left in the code.

        Step 2 of retiring a patch (see ``patched``): once no object that began before
        the patch is alive, replace ``if run.patched(name): new else: old`` with
        ``run.deprecate_patch(name)`` followed by the new code. Objects whose memory
        recorded the patch replay past its mark; new objects record nothing. Once no
        object with the mark is alive either, remove the call.
        """
        key = self._key(consume=False)
        recs = self._recorded(key)
        if recs and recs[0].kind == Kind.PATCHED and recs[0].body.get("name") == name:
            self._key()
        self._patches[name] = True

    def check_finished(self) -> None:
        """At the agent's end, memory must not hold commands the code no longer issues."""
        if self._pos <= self._max_recorded:
            last = max((p for p in (*self._history, *self._done)
                        if _top(p) == self._max_recorded), key=str)
            first = self._recorded(last)[0].body
            raise Park(
                NonDeterminismError(
                    self._pos,
                    f"{first.get('cmd')}({first.get('name')!r}) at #{self._max_recorded}",
                    "the agent returning",
                )
            )

    @staticmethod
    def _find(recs: Sequence[Record], kind: Kind) -> Record | None:
        for rec in recs:
            if rec.kind == kind:
                return rec
        return None

    # -- commands --------------------------------------------------------------

    @overload
    async def step(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        name: str | None = None,
        idempotent: bool | None = None,
        retry: RetryPolicy | None = None,
        requires: set[str] | frozenset[str] | None = None,
        **kwargs: Any,
    ) -> T: ...

    @overload
    async def step(
        self,
        fn: Callable[..., T],
        *args: Any,
        name: str | None = None,
        idempotent: bool | None = None,
        retry: RetryPolicy | None = None,
        requires: set[str] | frozenset[str] | None = None,
        **kwargs: Any,
    ) -> T: ...

    async def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        idempotent: bool | None = None,
        retry: RetryPolicy | None = None,
        requires: set[str] | frozenset[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once, durably; on replay return its record.

        ``idempotent=False`` records "started" first: after a crash mid-step the
        agent gets ``StepInDoubtError`` instead of a silent second run. ``retry``
        sets attempts and pace (semantic backoff); between attempts the object is
        dormant. Options may also be set with ``@perdure.step(...)`` on ``fn``.
        """
        if name:
            step_name = name
        elif fn is self._last_fn:  # a loop calls one function: its name is known
            step_name = self._last_name
        else:
            step_name = _step_name(fn)
            self._last_fn, self._last_name = fn, step_name
        if _branch.get() is None:  # on the main line, a step whose result is recorded
            at = self._pos
            done = self._done.get(at)
            if done is not None and (body := done.body).get("name") == step_name:
                self._pos = at + 1
                result = body.get("result")
                kind = type(result)
                return detached(result) if kind is dict or kind is list else result
        pos, recs = self._take("step", step_name)
        for rec in recs:  # replay: the recorded result, nothing runs
            if rec.kind == _STEP_DONE:
                result = rec.body.get("result")
                kind = type(result)
                return detached(result) if kind is dict or kind is list else result
        opts: Mapping[str, Any] = getattr(fn, "__perdure_step__", {})
        if idempotent is None:
            idempotent = bool(opts.get("idempotent", True))
        policy = retry or opts.get("retry") or DEFAULT_RETRY
        key = f"{self.object_id}/{pos}/{step_name}"
        failures = [r for r in recs if r.kind == Kind.STEP_FAILED]
        if failures and failures[-1].body.get("final"):
            raise rebuild_error(step_name, failures[-1].body["error"]) from None
        if self._find(recs, Kind.STEP_IN_DOUBT) is not None:
            raise StepInDoubtError(step_name, key)
        self._boundary()
        started = [r for r in recs if r.kind == Kind.STEP_STARTED]
        if len(started) > len(failures) and pos not in self._started_here:
            await self._journal.commit(
                [RecordDraft(Kind.STEP_IN_DOUBT, {"pos": pos, "cmd": "step", "name": step_name,
                                                  "key": key})]
            )
            raise StepInDoubtError(step_name, key)
        if failures:
            retry_at = failures[-1].body.get("retry_at")
            if retry_at is not None and self._clock() < retry_at:
                raise Suspend([], ready_at=retry_at, reason=f"retry of {step_name} not due")
        needs = frozenset(requires if requires is not None else opts.get("requires") or ())
        if needs - self._capabilities:
            self._lacking(step_name, pos, needs)
        attempt = len(failures) + 1
        base = {"pos": pos, "cmd": "step", "name": step_name}
        if monotonic() - self._journal.flags_at > FLAGS_FRESH:  # else the last commit's
            await self._fresh_flags()
            self._boundary()  # no step starts once a cancel (or pause) is known
        if self._poisoned_at:
            self._poisoned(step_name, pos)
        if not idempotent:
            self._started_here.add(pos)
            await self._journal.commit(
                [RecordDraft(Kind.STEP_STARTED, {**base, "attempt": attempt, "key": key})]
            )
        elif self._journal.volatile:
            # Values drawn since the last commit (uuid, now, random) may flow into this
            # step's side effects: make them durable first, or a crash after the effect
            # would let replay draw different ones than the outside world saw. A
            # received event needs no such commit: until its receipt is committed it
            # stays in the inbox, and replay receives the same event again.
            await self._journal.commit()
        info = StepInfo(self.object_id, step_name, pos, attempt, key, self.epoch)
        began = time.perf_counter()
        try:
            result = await self._step_executor(info, fn, args, kwargs)
            result_bytes = encode(result, what=f"result of step {step_name!r}")
        except CannotDo as exc:
            self._cannot_do(step_name, pos, exc.reason)
        except Exception as exc:  # noqa: BLE001 - recorded, then raised as memory rebuilds it
            latency = time.perf_counter() - began
            error = await self._record_failure(base, attempt, failures, policy, exc, latency,
                                               key)
            # The agent gets the exception as memory rebuilds it, on this first run as on
            # every replay: the same type, message and attributes, or the same stand-in.
            raise rebuild_error(step_name, error) from None
        self._poisoned_at = False  # a step ran to its end on this claim: the worker lived
        latency = round(time.perf_counter() - began, 6)
        # The agent sees the value as memory holds it (tuples as lists, keys as strings),
        # so the first run and every replay see exactly the same thing. A scalar comes
        # back from JSON as itself.
        recorded = result if type(result) in _SCALARS else decode(result_bytes)
        await self._journal.commit(
            [RecordDraft(Kind.STEP_DONE, {**base, "attempt": attempt, "latency": latency,
                                          "result": recorded},
                         step_done_bytes(attempt, latency, step_name, pos, result_bytes))],
            **self._routing_reset(),
        )
        return recorded

    async def _fresh_flags(self) -> None:
        """Know the object's cancel and pause flags as of now (within ``FLAGS_FRESH``):
        a commit reports them back, so a step right after one needs no read."""
        if (self._refresh_flags is not None
                and time.monotonic() - self._journal.flags_at > FLAGS_FRESH):
            await self._refresh_flags()
            self._journal.flags_at = time.monotonic()

    def _poisoned(self, step_name: str, pos: int | str) -> None:
        """Workers died in a row at this point: park instead of dying once more."""
        reason = (f"the worker died {self._crashes} times in a row inside step "
                  f"{step_name!r} (position {pos}); fix the cause, then run "
                  f"`perdure resume {self.object_id}`")
        raise Park(RuntimeError(reason), RecordDraft(Kind.PARKED, {
            "reason": reason, "code": "worker_died", "step": step_name, "step_pos": pos,
            "crashes": self._crashes}))

    def _routing_reset(self) -> dict[str, Any]:
        """After a step that needed routing got done, any node may take the object again."""
        if not self._rerouted:
            return {}
        self._rerouted = False
        return {"requires": tuple(self._intent.requires), "clear_avoid": True}

    @property
    def _node_id(self) -> str:
        return self._journal.signer.node_id

    def _lacking(self, step_name: str, pos: int | str, needs: frozenset[str]) -> None:
        """This node lacks a capability the step needs: say so once, and let the object go
        to a node that has it."""
        missing = sorted(needs - self._capabilities)
        refusal = f"{self._node_id}:lacks:{','.join(missing)}"
        drafts = []
        if refusal not in self._refusals:
            drafts.append(RecordDraft(Kind.CAPABILITY_MISSING, {
                "refusal": refusal, "node": self._node_id, "capabilities": missing,
                "step": step_name, "step_pos": pos, "at": self._clock()}))
        raise Suspend(drafts, ready_at=self._clock(), status="ready",
                      requires=tuple(sorted(set(self._intent.requires) | needs)),
                      reason=f"node {self._node_id} lacks {', '.join(missing)} for {step_name}")

    def _cannot_do(self, step_name: str, pos: int | str, reason: str) -> None:
        """The step said this node cannot do it: a negative capability in memory, and the
        object goes to another node."""
        refusal = f"{self._node_id}:cannot:{step_name}"
        drafts = []
        if refusal not in self._refusals:
            drafts.append(RecordDraft(Kind.CAPABILITY_MISSING, {
                "refusal": refusal, "node": self._node_id, "cannot_do": step_name,
                "reason": reason, "step_pos": pos, "at": self._clock()}))
        raise Suspend(drafts, ready_at=self._clock(), status="ready", avoid_node=self._node_id,
                      reason=f"node {self._node_id} cannot do {step_name}: {reason}")

    async def _record_failure(
        self,
        base: dict[str, Any],
        attempt: int,
        previous: Sequence[Record],
        policy: RetryPolicy,
        exc: Exception,
        latency: float,
        key: str,
    ) -> dict[str, Any]:
        """Record a failed attempt: a final failure (committed; its error body returned as
        memory holds it) or a retry later (the object goes dormant: ``Suspend``)."""
        error_class = classify(exc)
        if isinstance(exc, SerializationError):
            error_class = ErrorClass.PERMANENT
        hint = getattr(exc, "retry_after", None)
        retry_after = float(hint) if isinstance(hint, int | float) else None
        history = [
            Failure(
                attempt=int(r.body.get("attempt", i + 1)),
                error_class=ErrorClass(r.body.get("error_class", "unknown")),
                latency=float(r.body.get("latency", 0.0)),
                retry_after=r.body.get("retry_after"),
            )
            for i, r in enumerate(previous)
        ]
        history.append(Failure(attempt, error_class, latency, retry_after))
        delay = next_delay(history, policy, salt=key)
        body = {
            **base,
            "attempt": attempt,
            "error": error_body(exc),
            "error_class": str(error_class),
            "latency": round(latency, 6),
            "retry_after": retry_after,
            "final": delay is None,
        }
        if delay is None:
            body["error"] = decode(encode(body["error"], what="step failure"))
            await self._journal.commit([RecordDraft(Kind.STEP_FAILED, body)])
            return dict(body["error"])
        retry_at = self._clock() + delay
        body["retry_at"] = retry_at
        raise Suspend(
            [
                RecordDraft(Kind.STEP_FAILED, body),
                RecordDraft(
                    Kind.DORMANT,
                    {"pos": base["pos"], "cmd": "step", "name": base["name"], "reason": "retry",
                     "wake_at": retry_at},
                ),
            ],
            ready_at=retry_at,
            reason=f"retry {base['name']} in {delay:.3f}s",
        ) from exc

    async def sleep(self, seconds: float) -> None:
        """Go dormant for ``seconds``; the node lets the object go until the timer is due."""
        if hasattr(seconds, "total_seconds"):
            seconds = seconds.total_seconds()
        pos, recs = self._take("sleep", None)
        if self._find(recs, Kind.WOKE) is not None:
            return
        dormant = self._find(recs, Kind.DORMANT)
        now = self._clock()
        if dormant is not None:
            wake_at = float(dormant.body["wake_at"])
            if now >= wake_at:
                self._journal.defer(RecordDraft(Kind.WOKE, {"pos": pos, "cmd": "sleep"}))
                return
            self._boundary()
            raise Suspend([], ready_at=wake_at, reason="sleeping")
        self._boundary()
        if seconds <= 0:
            self._journal.defer(RecordDraft(Kind.WOKE, {"pos": pos, "cmd": "sleep"}))
            return
        wake_at = now + float(seconds)
        raise Suspend(
            [RecordDraft(Kind.DORMANT, {"pos": pos, "cmd": "sleep", "reason": "sleep",
                                        "wake_at": wake_at, "seconds": float(seconds)})],
            ready_at=wake_at,
            reason=f"sleep {seconds}s",
        )

    async def wait_for(self, event: str, *, timeout: float | None = None) -> Any:
        """Wait for the event ``event``; return its payload, or ``None`` after ``timeout`` s.

        Events sent before the agent waits are kept and delivered in order.
        """
        if timeout is not None and hasattr(timeout, "total_seconds"):
            timeout = timeout.total_seconds()
        check_name(event, "event name")
        pos, recs = self._take("wait", event)
        got = self._find(recs, Kind.EVENT_RECEIVED)
        if got is not None:
            return detached(got.body.get("payload"))
        if self._find(recs, Kind.WAIT_TIMED_OUT) is not None:
            return None
        self._boundary()
        for ev in await self._inbox(event):
            if ev.name == event and ev.event_id not in self._consumed:
                self._consumed.add(ev.event_id)
                digest = self._vouched(ev)
                if digest is None:
                    continue  # refused, with a record that says why
                try:
                    payload = decode(ev.payload)
                except ValueError:
                    payload = {"undecodable_payload": ev.payload.decode("utf-8", "replace")}
                # Recorded with the next commit (usually the next step's), which marks
                # the event consumed: until then it stays in the inbox, and a crash
                # before that commit delivers it again on replay.
                self._journal.defer(
                    RecordDraft(Kind.EVENT_RECEIVED, {"pos": pos, "cmd": "wait", "name": event,
                                                      "event_id": ev.event_id,
                                                      "event_hash": digest,
                                                      "payload": payload}),
                    consume_event_ids=[ev.event_id],
                )
                return payload
        dormant = self._find(recs, Kind.DORMANT)
        now = self._clock()
        if dormant is not None:
            deadline = dormant.body.get("wake_at")
            drafts: list[RecordDraft] = []
        else:
            deadline = now + float(timeout) if timeout is not None else None
            drafts = [RecordDraft(Kind.DORMANT, {"pos": pos, "cmd": "wait", "name": event,
                                                 "reason": "event", "event": event,
                                                 "wake_at": deadline})]
        if deadline is not None and now >= deadline:
            self._journal.defer(RecordDraft(Kind.WAIT_TIMED_OUT, {"pos": pos, "cmd": "wait",
                                                                  "name": event}))
            return None
        raise Suspend(drafts, ready_at=deadline, waiting_event=event,
                      reason=f"waiting for event {event!r}")

    def _vouched(self, ev: Event) -> str | None:
        """The digest of ``ev`` if its seal verifies under a trusted key and memory has
        not received it before; otherwise ``None``, with a refusal deferred to the next
        commit (which consumes the event, so it never comes back)."""
        if self._check_event is None:
            return ""
        digest, problem = self._check_event(ev)
        if problem is None and digest is not None and digest in self._received():
            problem = "memory already holds an event with this digest (a replayed copy)"
        if problem is None:
            assert digest is not None
            self._received().add(digest)
            return digest
        self._journal.defer(
            RecordDraft(Kind.EVENT_REFUSED, {"event_id": ev.event_id, "name": ev.name,
                                             "event_hash": digest, "reason": problem}),
            consume_event_ids=[ev.event_id],
        )
        self.refused.append((ev.event_id, ev.name, problem))
        return None

    def _received(self) -> set[str]:
        """Digests of the events memory holds as received (read once, then kept)."""
        if self._digests is None:
            found = {str(rec.body["event_hash"]) for recs in self._history.values()
                     for rec in recs if rec.kind == _EVENT_RECEIVED}
            found.update(str(body["event_hash"]) for body in self._children.values()
                         if body.get("event_hash"))
            found.update(self._refined)
            found.discard("None")
            self._digests = found
        return self._digests

    async def _inbox(self, name: str) -> Sequence[Event]:
        """The pending events, for a wait for ``name``: the inbox as the worker read it
        before running the agent, the first time and if it holds such an event (usually
        the one that woke the object), else as the store has it now."""
        pending, self._pending = self._pending, ()
        for ev in pending:
            if ev.name == name and ev.event_id not in self._consumed:
                return pending
        return await self._load_events()

    def _value(self, cmd: str, make: Callable[[], Any]) -> Any:
        pos, recs = self._take(cmd, None)
        rec = self._find(recs, Kind.VALUE)
        if rec is not None:
            return detached(rec.body["value"])
        value = make()
        self._journal.defer(RecordDraft(Kind.VALUE, {"pos": pos, "cmd": cmd, "value": value}))
        return value

    async def now(self) -> float:
        """The current time, recorded: replay sees the same value."""
        return float(self._value("now", self._clock))

    async def uuid(self) -> str:
        """A random UUID (hex string), recorded."""
        return str(self._value("uuid", lambda: str(_uuid.uuid4())))

    async def random(self) -> float:
        """A random float in [0, 1), recorded."""
        return float(self._value("random", _random.random))

    async def refine(self, **changes: Any) -> Intent:
        """Refine this object's intent (deadline, max_failures, goal, requires).

        Appends an intent-refinement record with the next intent version; ``run.intent``
        shows it at once, and on every later cycle.
        """
        key, recs = self._take("refine", None)
        rec = self._find(recs, Kind.INTENT_REFINED)
        if rec is not None:
            recorded = Intent.from_body(rec.body["intent"])
            # Replay never winds the intent back: later refinements (from outside, or
            # further in memory) already made the current intent newer than this one.
            if recorded.version_no > self._intent.version_no:
                self._intent = recorded
            return recorded
        self._boundary()
        refined = self._intent.refined(dict(changes))
        await self._journal.commit([RecordDraft(Kind.INTENT_REFINED, {
            "pos": key, "cmd": "refine", "intent": refined.to_body(),
            "changes": encode_json(changes)})],
            requires=tuple(refined.requires) if "requires" in changes else None)
        self._intent = refined
        return refined

    async def delegate(self, agent: Callable[..., Any] | str, *args: Any,
                       object_id: str | None = None, **kwargs: Any) -> ChildHandle:
        """Create a child object running ``agent(*args, **kwargs)``, on any node.

        The child has its own intent, context and memory, with this object as parent
        (and the same root and trace). ``await child`` (or ``await child.result()``)
        makes this object dormant until the child terminates, then returns its result
        or raises ``ChildFailedError``. Its id is ``object_id`` or
        ``<this id>.<position>``, the same on every replay.
        """
        name = agent if isinstance(agent, str) else str(
            getattr(agent, "__perdure_agent__", None) or _qualname(agent))
        if object_id is not None:
            check_object_id(object_id, "child object id")
        key, recs = self._take("delegate", name)
        rec = self._find(recs, Kind.DELEGATED)
        if rec is not None:
            return ChildHandle(self, str(rec.body["child_id"]))
        self._boundary()
        if self._spawn is None:
            raise RuntimeError("delegation needs a running node")
        child_id = object_id or f"{self.object_id}.{key}"
        earlier = self._delegated_at(child_id)
        if earlier is not None:
            raise ObjectConflictError(
                f"cannot delegate to {child_id!r} at command #{key}: this object delegated to "
                f"it already at command #{earlier}; give each child its own object_id")
        version = await self._spawn(agent, tuple(args), dict(kwargs), child_id, self._context)
        await self._journal.commit([RecordDraft(Kind.DELEGATED, {
            "pos": key, "cmd": "delegate", "name": name, "child_id": child_id,
            "version": version})])
        self._journal.delegated.append(child_id)
        return ChildHandle(self, child_id)

    def _delegated_at(self, child_id: str) -> int | str | None:
        """The position at which memory (or this run) delegated to ``child_id``, if any."""
        for recs in self._history.values():
            for rec in recs:
                if rec.kind == Kind.DELEGATED and rec.body.get("child_id") == child_id:
                    pos: int | str | None = rec.body.get("pos")
                    return pos
        if child_id in self._journal.delegated:
            return "earlier in this run"
        return None

    async def join(self, *children: ChildHandle | str) -> list[Any]:
        """Wait for every child to terminate; their results in order.

        The object is dormant meanwhile and wakes once, when the last of them is
        done. The first child (in argument order) that failed raises
        ``ChildFailedError``.
        """
        ids = [c.child_id if isinstance(c, ChildHandle) else str(c) for c in children]
        key, recs = self._take("join", ",".join(ids))
        drafts: list[RecordDraft] = []
        consume: list[int] = []
        if any(c not in self._children for c in ids):
            for ev in await self._load_events():
                if ev.name != CHILD_EVENT or ev.event_id in self._consumed:
                    continue
                self._consumed.add(ev.event_id)
                digest = self._vouched(ev)
                if digest is None:
                    continue
                body = child_finished_body(ev.payload, ev.event_id, digest)
                consume.append(ev.event_id)
                if body is not None and str(body["child_id"]) not in self._children:
                    self._children[str(body["child_id"])] = body
                    drafts.append(RecordDraft(Kind.CHILD_FINISHED, body))
        waiting = [c for c in ids if c not in self._children]
        if waiting:
            self._boundary()
            if self._find(recs, Kind.DORMANT) is None:
                drafts.append(RecordDraft(Kind.DORMANT, {
                    "pos": key, "cmd": "join", "name": ",".join(ids), "reason": "children",
                    "children": ids, "event": CHILD_EVENT, "wake_at": None}))
            raise Suspend(drafts, ready_at=None, waiting_event=CHILD_EVENT, children=ids,
                          consume_event_ids=consume,
                          reason=f"waiting for {len(waiting)} child object(s)")
        if drafts:
            await self._journal.commit(drafts, consume_event_ids=consume)
        results = []
        for child_id in ids:
            body = self._children[child_id]
            if body.get("outcome") != "completed":
                error = body.get("error") or {}
                raise ChildFailedError(child_id, str(body.get("outcome")),
                                       str(error.get("type", "unknown")),
                                       str(error.get("message", "")))
            results.append(detached(body.get("result")))
        return results

    async def gather(self, *branches: Awaitable[Any]) -> list[Any]:
        """Run branches concurrently; their results in argument order.

        Each branch's commands take positions from the branch's place in this call,
        never from the order the branches happen to finish, so after a crash only
        branches without a record run again and finished ones return their records.
        Branches may be steps, child handles, or any coroutine using this run. If
        any branch goes dormant, the object waits (once) for all of them; the first
        failing branch, in argument order, raises.
        """
        key, recs = self._take("gather", None)
        tasks: list[asyncio.Future[Any]] = []
        for index, branch in enumerate(branches):
            token = _branch.set(_Branch(f"{key}.{index}"))
            try:
                tasks.append(asyncio.ensure_future(branch))
            finally:
                _branch.reset(token)
        if tasks:
            await asyncio.wait(tasks)
        failures: list[BaseException | None] = []
        for task in tasks:
            if task.cancelled():
                failures.append(asyncio.CancelledError())
            else:
                failures.append(task.exception())
        for signal in (Park, LeaseLostError, CancelRequestedError, DeadlineExceeded):
            for exc in failures:
                if isinstance(exc, signal):
                    raise exc
        for exc in failures:
            if exc is not None and not isinstance(exc, Exception | Suspend):
                raise exc
        suspends = [exc for exc in failures if isinstance(exc, Suspend)]
        if suspends:
            raise self._combine(key, recs, suspends)
        for exc in failures:
            if exc is not None:
                raise exc
        return [task.result() for task in tasks]

    def _combine(self, key: int | str, recs: Sequence[Record], suspends: Sequence[Suspend]
                 ) -> Suspend:
        drafts = [draft for sus in suspends for draft in sus.drafts]
        ready = [sus.ready_at for sus in suspends if sus.ready_at is not None]
        ready_at = min(ready) if ready else None
        events = [sus.waiting_event for sus in suspends if sus.waiting_event]
        children = [child for sus in suspends for child in sus.children]
        status = next((sus.status for sus in suspends if sus.status != "dormant"), "dormant")
        routed = next((sus for sus in suspends if sus.requires or sus.avoid_node), None)
        if status == "dormant":
            body = {"pos": key, "cmd": "gather", "reason": "gather", "wake_at": ready_at,
                    "event": events[0] if events else None, "children": children}
            last = [r for r in recs if r.kind == Kind.DORMANT]
            if not last or {k: last[-1].body.get(k) for k in body} != body:
                drafts.append(RecordDraft(Kind.DORMANT, body))
        return Suspend(
            drafts, ready_at=ready_at, waiting_event=events[0] if events else None,
            status=status, reason="; ".join(sus.reason for sus in suspends),
            children=children,
            consume_event_ids=[i for sus in suspends for i in sus.consume_event_ids],
            requires=routed.requires if routed else None,
            avoid_node=routed.avoid_node if routed else None,
        )

    async def progress(self, **fields: Any) -> None:
        """Note progress in memory (shown by ``perdure show``); not part of replay.

        While the agent is still replaying recorded commands the note is skipped:
        it was written (or lost with the crash) the first time round. A note issued
        right after the last recorded command may appear once more after a resume. The
        note is written with the next record (a step's result, say), never on its own:
        a crash in between loses it.
        """
        if self.replaying:
            return
        self._journal.defer(RecordDraft(Kind.PROGRESS, {"fields": fields}), volatile=False)


def encode_json(value: Any) -> Any:
    """``value`` as memory will hold it (raises ``SerializationError`` if it cannot)."""
    return decode(encode(value))


class ChildHandle:
    """A delegated child object, from inside its parent. ``await`` it for its result."""

    def __init__(self, run: Run, child_id: str) -> None:
        self._run = run
        self.child_id = child_id

    def __repr__(self) -> str:
        return f"ChildHandle({self.child_id!r})"

    async def result(self) -> Any:
        """Wait (dormant) for the child to terminate; its result or ``ChildFailedError``."""
        return (await self._run.join(self))[0]

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result().__await__()


class SyncRun:
    """The ``Run`` API without ``await``, for plain ``def`` agents running off the event loop."""

    def __init__(self, run: Run, loop: asyncio.AbstractEventLoop) -> None:
        self._run = run
        self._loop = loop

    def _call(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    @property
    def object_id(self) -> str:
        """This object's id."""
        return self._run.object_id

    @property
    def intent(self) -> Intent:
        """The current intent."""
        return self._run.intent

    @property
    def context(self) -> Context:
        """Identity, lineage and labels."""
        return self._run.context

    @property
    def epoch(self) -> int:
        """The fencing epoch."""
        return self._run.epoch

    @overload
    def step(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T: ...

    @overload
    def step(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

    def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """See ``Run.step``: the same options, without ``await``."""
        return self._call(self._run.step(fn, *args, **kwargs))

    def sleep(self, seconds: float) -> None:
        """See ``Run.sleep``."""
        self._call(self._run.sleep(seconds))

    def wait_for(self, event: str, *, timeout: float | None = None) -> Any:
        """See ``Run.wait_for``."""
        return self._call(self._run.wait_for(event, timeout=timeout))

    def now(self) -> float:
        """See ``Run.now``."""
        return self._call(self._run.now())

    def uuid(self) -> str:
        """See ``Run.uuid``."""
        return self._call(self._run.uuid())

    def random(self) -> float:
        """See ``Run.random``."""
        return self._call(self._run.random())

    def patched(self, name: str) -> bool:
        """See ``Run.patched``."""
        return self._run.patched(name)

    def deprecate_patch(self, name: str) -> None:
        """See ``Run.deprecate_patch``."""
        self._run.deprecate_patch(name)

    def refine(self, **changes: Any) -> Intent:
        """See ``Run.refine``."""
        return self._call(self._run.refine(**changes))

    def delegate(self, agent: Callable[..., Any] | str, *args: Any,
                 object_id: str | None = None, **kwargs: Any) -> SyncChildHandle:
        """See ``Run.delegate``; the handle's ``result()`` waits without ``await``."""
        handle = self._call(self._run.delegate(agent, *args, object_id=object_id, **kwargs))
        return SyncChildHandle(self, handle.child_id)

    def join(self, *children: SyncChildHandle | str) -> list[Any]:
        """See ``Run.join``."""
        ids = [c.child_id if isinstance(c, SyncChildHandle) else c for c in children]
        return self._call(self._run.join(*ids))

    def progress(self, **fields: Any) -> None:
        """See ``Run.progress``."""
        self._call(self._run.progress(**fields))


def is_async(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions (and callables whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method itself, not callability
    )


class SyncChildHandle:
    """A delegated child object, from inside a plain ``def`` parent."""

    def __init__(self, run: SyncRun, child_id: str) -> None:
        self._run = run
        self.child_id = child_id

    def __repr__(self) -> str:
        return f"SyncChildHandle({self.child_id!r})"

    def result(self) -> Any:
        """Wait (dormant) for the child; its result or ``ChildFailedError``."""
        return self._run.join(self)[0]
