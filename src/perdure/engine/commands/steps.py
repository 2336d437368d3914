"""``run.step``: run a function once, durably; on replay, return what memory holds.

The replay rule: a position whose records hold the step's result (``step_done``)
returns that result and runs nothing; one holding a final ``step_failed`` raises the
error as memory rebuilds it; one holding ``step_in_doubt``, or a ``step_started``
with no outcome after it, raises ``StepInDoubtError`` (see ``step_failures``).

The execution rule, for a position with no outcome yet: check the run may go on
(cancel, pause, deadline, lease), that a retry is due, that this node has what the
step needs, that the cancel and pause flags are fresh and that the step has not
been killing its workers; record ``step_started`` for a non-idempotent step (or
commit values drawn since the last commit); run the function through the node's
executor; record its result (``step_done``) or its failure.

This is the hot path of both a resume (a replayed step) and of new work (one commit
per step). A step on the main line whose result stands alone at its position (most
of a long memory) is answered inline from the run's quick index; every other job is
a plain function call, with no object or closure per step.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, Final, TypeVar, overload

from perdure.core.backoff import RetryPolicy
from perdure.core.bodies import StepDone, StepStarted
from perdure.core.codec import decode, detached
from perdure.core.records import Kind, Record, RecordDraft
from perdure.engine.checkpoints import Marks, drop_step_slot, step_marks
from perdure.engine.commands.positions import branch
from perdure.engine.commands.step_failures import (
    cannot_do,
    check_capabilities,
    check_started,
    node_problem,
    poisoned,
    record_failure,
    recorded_failures,
    retry_not_due,
)
from perdure.engine.commands.step_timeout import check_timeout, run_with_timeout
from perdure.engine.context import StepInfo
from perdure.engine.signals import Park, Suspend
from perdure.errors import CannotDo
from perdure.hooks import StepRecorded

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = [
    "CMD",
    "DEFAULT_RETRY",
    "FLAGS_FRESH",
    "done_draft",
    "durable_first",
    "fresh_flags",
    "qualname",
    "recorded_result",
    "routing_reset",
    "step",
]

T = TypeVar("T")

CMD: Final = "step"  # the command name in the records of a step
DEFAULT_RETRY = RetryPolicy()
FLAGS_FRESH = 0.005  # seconds: a step starts only on cancel/pause flags at most this old

_SCALARS = (int, float, str, bool, type(None))  # what JSON gives back as it was given
_STEP_DONE = Kind.STEP_DONE.value  # compared as the plain string a record holds
_NOT_RECORDED: Any = object()  # a position holds no result for the step (results may be None)


@overload
async def step(
    self: Run,
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    name: str | None = None,
    idempotent: bool | None = None,
    retry: RetryPolicy | None = None,
    requires: set[str] | frozenset[str] | None = None,
    timeout: float | None = None,
    **kwargs: Any,
) -> T: ...


@overload
async def step(
    self: Run,
    fn: Callable[..., T],
    *args: Any,
    name: str | None = None,
    idempotent: bool | None = None,
    retry: RetryPolicy | None = None,
    requires: set[str] | frozenset[str] | None = None,
    timeout: float | None = None,
    **kwargs: Any,
) -> T: ...


async def step(
    self: Run,
    fn: Callable[..., Any],
    *args: Any,
    name: str | None = None,
    idempotent: bool | None = None,
    retry: RetryPolicy | None = None,
    requires: set[str] | frozenset[str] | None = None,
    timeout: float | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` once, durably; on replay return its record.

    ``idempotent=False`` records "started" first: after a crash mid-step the
    agent gets ``StepInDoubtError`` instead of a silent second run. ``retry``
    sets attempts and pace (semantic backoff); between attempts the object is
    dormant. ``timeout`` (seconds) ends an attempt that runs longer with
    ``StepTimeoutError``, retried like any timeout (see ``step_timeout``). Options may also be
    set with ``@perdure.step(...)`` on ``fn``.
    """
    # Resolve: the name the step is recorded under.
    if name:
        step_name = name
    elif fn is self._last_fn:  # a loop calls one function: its name is known
        step_name = self._last_name
    else:
        step_name = _remember_name(self, fn)
    # Replay: the recorded outcome, and nothing runs. On the main line, a result alone
    # at its position (most of a long memory) comes from the quick index, inline.
    if not self._branched or branch.get() is None:
        at = self._pos
        done = self._done.get(at)
        if done is not None and (body := done.body).get("name") == step_name:
            self._pos = at + 1
            result = body.get("result")
            kind = type(result)
            return detached(result) if kind is dict or kind is list else result
    pos, recs = self._take(CMD, step_name)
    if recs:
        result = recorded_result(recs)
        if result is not _NOT_RECORDED:
            return result
    key = f"{self.object_id}/{pos}/{step_name}"
    failures = recorded_failures(step_name, key, recs) if recs else []
    # Execute: only once the run may go on, here and now.
    self._boundary()
    if recs:
        await check_started(self, step_name, pos, key, recs, failures)
        retry_not_due(self, step_name, failures)
    opts: Mapping[str, Any] = getattr(fn, "__perdure_step__", {})
    limit = check_timeout(timeout if timeout is not None else opts.get("timeout"), step_name)
    check_capabilities(self, step_name, pos, requires, opts)
    attempt = len(failures) + 1
    if monotonic() - self._journal.flags_at > FLAGS_FRESH:  # else the last commit's
        await fresh_flags(self)
        self._boundary()  # no step starts once a cancel (or pause) is known
    if self._poisoned_at:
        poisoned(self, step_name, pos)
    first = durable_first(self, pos, step_name, attempt, key, idempotent, opts)
    if first is not None:
        await self._journal.commit(first)
    info = StepInfo(self.object_id, step_name, pos, attempt, key, self.epoch,
                    *step_marks(self, pos, step_name, attempt, recs))
    began = time.perf_counter()
    try:
        if limit is None:
            result = await self._step_executor(info, fn, args, kwargs)
        else:
            result = await run_with_timeout(
                lambda: self._step_executor(info, fn, args, kwargs), limit, step_name)
        stored, result_bytes = self._stored(result, what=f"result of step {step_name!r}")
    except (CannotDo, ModuleNotFoundError) as exc:  # this node's problem: another may
        cannot_do(self, step_name, pos, node_problem(exc) or str(exc))
    except Exception as exc:  # noqa: BLE001 - recorded, then raised as memory rebuilds it
        policy = retry or opts.get("retry") or DEFAULT_RETRY
        error = await _failed(self, pos, step_name, attempt, failures, policy, exc,
                              time.perf_counter() - began, key)
        await drop_step_slot(self, pos, info._marks)  # a final failure: its outcome
        raise error from None
    # Record: the result as memory holds it.
    self._poisoned_at = False  # a step ran to its end on this claim: the worker lived
    latency = round(time.perf_counter() - began, 6)
    # The agent sees the value as memory holds it (tuples as lists, keys as strings),
    # so the first run and every replay see exactly the same thing. A scalar comes
    # back from JSON as itself.
    recorded = result if type(result) in _SCALARS else decode(result_bytes)
    await self._journal.commit(
        [done_draft(pos, step_name, attempt, latency, recorded, result_bytes)],
        **routing_reset(self))
    if self._slots or type(info._marks) is Marks:
        await drop_step_slot(self, pos, info._marks)
    _told(self, step_name, pos, True, latency)
    # Sealed: memory keeps the ciphertext, the agent gets what replay will give it.
    return recorded if stored is result else self._opened(recorded)


async def _failed(run: Run, pos: int | str, step_name: str, attempt: int,
                  failures: Sequence[Record], policy: RetryPolicy, exc: Exception,
                  latency: float, key: str) -> BaseException:
    """Record a step's failure (``record_failure``) and tell the hooks; returns the error
    the agent gets, or raises the signal that makes the object wait or park."""
    try:
        error = await record_failure(run, pos, step_name, attempt, failures, policy, exc,
                                     latency, key)
    except (Suspend, Park):  # recorded: the object waits for its retry, or parks
        _told(run, step_name, pos, False, latency)
        raise
    _told(run, step_name, pos, False, latency)
    return error


def _told(run: Run, step_name: str, pos: int | str, ok: bool, latency: float) -> None:
    """Tell the node's hooks that a step was recorded (nothing when nobody listens)."""
    hooks = run._journal.hooks
    if hooks is not None and hooks.active:
        hooks.emit(StepRecorded(run._journal.signer.node_id, run.object_id, step_name,
                                str(pos), ok, latency))


def qualname(fn: Callable[..., Any]) -> str:
    """The name ``fn`` goes by in memory: its agent name, else its qualified name."""
    name = getattr(fn, "__perdure_name__", None) or getattr(fn, "__qualname__", None)
    return str(name or repr(fn))


def _remember_name(run: Run, fn: Callable[..., Any]) -> str:
    """The name a step of ``fn`` is recorded under when the call gives none; kept for
    the next call, as a loop calls one function over and over."""
    opts: Mapping[str, Any] = getattr(fn, "__perdure_step__", {})
    step_name = str(opts.get("name") or qualname(fn))
    run._last_fn, run._last_name = fn, step_name
    return step_name


def recorded_result(recs: Sequence[Record]) -> Any:
    """The result a position's records hold for the step, or ``_NOT_RECORDED`` (a
    position the quick index does not hold: in a ``gather`` branch, or with more
    records than the result)."""
    for rec in recs:
        if rec.kind == _STEP_DONE:
            result = rec.body.get("result")
            kind = type(result)
            return detached(result) if kind is dict or kind is list else result
    return _NOT_RECORDED


def durable_first(run: Run, pos: int | str, step_name: str, attempt: int, key: str,
                  idempotent: bool | None, opts: Mapping[str, Any]) -> list[RecordDraft] | None:
    """What must be durable before the step's body runs (``None``: nothing).

    A non-idempotent step (by the call's option, else by ``@perdure.step``'s)
    records ``step_started``: a crash during the body then leaves it in doubt, never
    silently run twice. Before any other step, values drawn since the last commit
    (uuid, now, random) may flow into this step's side effects: make them durable
    first, or a crash after the effect would let replay draw different ones than the
    outside world saw. A received event needs no such commit: until its receipt is
    committed it stays in the inbox, and replay receives the same event again.
    """
    if idempotent is None:
        idempotent = bool(opts.get("idempotent", True))
    if not idempotent:
        run._started_here.add(pos)
        return [StepStarted(pos, step_name, attempt, key).draft()]
    if run._journal.volatile:
        return []
    return None


def done_draft(pos: int | str, step_name: str, attempt: int, latency: float, recorded: Any,
               result_bytes: bytes) -> RecordDraft:
    """The ``step_done`` record: its body's bytes put together around the result's,
    encoded once (``records.step_done_bytes``)."""
    return StepDone(pos, step_name, attempt, latency, recorded).draft(result_bytes)


async def fresh_flags(run: Run) -> None:
    """Know the object's cancel and pause flags as of now (within ``FLAGS_FRESH``):
    a commit reports them back, so a step right after one needs no read."""
    if run._refresh_flags is not None and monotonic() - run._journal.flags_at > FLAGS_FRESH:
        await run._refresh_flags()
        run._journal.flags_at = monotonic()


def routing_reset(run: Run) -> dict[str, Any]:
    """After a step that needed routing got done, any node may take the object again."""
    if not run._rerouted:
        return {}
    run._rerouted = False
    return {"requires": tuple(run._intent.requires), "clear_avoid": True}
