"""A step that does not simply run: it failed, is in doubt, needs another node, or kills workers.

The replay rule: a final ``step_failed`` at the step's position is raised again as
memory rebuilds it; a ``step_in_doubt`` record, or a ``step_started`` (on an earlier
claim) with no outcome after it, raises ``StepInDoubtError`` instead of a silent
second run; a retry whose time has not come leaves the object dormant until it has.

The execution rule: a failed attempt is recorded either as final (committed, and
raised into the agent as memory rebuilds it) or as a retry later (the object goes
dormant: ``Suspend``); a step needing a capability this node lacks, or raising
``CannotDo``, records a negative capability once and hands the object on; a step at
which workers died in a row too often parks the object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from perdure.core.backoff import ErrorClass, Failure, RetryPolicy, classify, next_delay
from perdure.core.bodies import (
    CapabilityMissing,
    Dormant,
    Parked,
    StepFailed,
    StepInDoubt,
)
from perdure.core.codec import decode, encode
from perdure.core.lifecycle import Status
from perdure.core.records import Kind, Record
from perdure.engine.commands.positions import find
from perdure.engine.failures import error_body, rebuild_error
from perdure.engine.signals import Park, Suspend
from perdure.errors import CannotDo, SerializationError, StepInDoubtError

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = [
    "cannot_do",
    "check_capabilities",
    "check_started",
    "lacking",
    "node_problem",
    "poisoned",
    "record_failure",
    "recorded_failures",
    "retry_not_due",
]


# -- replay: what memory says about earlier attempts ------------------------------------


def recorded_failures(step_name: str, key: str, recs: Sequence[Record]) -> list[Record]:
    """The failed attempts memory holds at the step's position.

    Raises what memory says ended the step: its final failure, rebuilt as the agent
    first saw it, or that it is in doubt.
    """
    failures = [r for r in recs if r.kind == Kind.STEP_FAILED]
    if failures and failures[-1].body.get("final"):
        raise rebuild_error(step_name, failures[-1].body["error"]) from None
    if find(recs, Kind.STEP_IN_DOUBT) is not None:
        raise StepInDoubtError(step_name, key)
    return failures


async def check_started(run: Run, step_name: str, pos: int | str, key: str,
                        recs: Sequence[Record], failures: Sequence[Record]) -> None:
    """A non-idempotent step that started on an earlier claim and has no outcome since:
    record that it is in doubt and raise ``StepInDoubtError``, never run it again."""
    started = [r for r in recs if r.kind == Kind.STEP_STARTED]
    if len(started) > len(failures) and pos not in run._started_here:
        await run._journal.commit([StepInDoubt(pos, step_name, key).draft()])
        raise StepInDoubtError(step_name, key)


def retry_not_due(run: Run, step_name: str, failures: Sequence[Record]) -> None:
    """The last attempt failed and its retry is not due yet: stay dormant until it is."""
    if failures:
        retry_at = failures[-1].body.get("retry_at")
        if retry_at is not None and run._clock() < retry_at:
            raise Suspend([], ready_at=retry_at, reason=f"retry of {step_name} not due")


# -- execution: a step that cannot run here, or fails ----------------------------------


def _node_id(run: Run) -> str:
    return run._journal.signer.node_id


def poisoned(run: Run, step_name: str, pos: int | str) -> NoReturn:
    """Workers died in a row at this point: park instead of dying once more."""
    reason = (f"the worker died {run._crashes} times in a row inside step "
              f"{step_name!r} (position {pos}); fix the cause, then run "
              f"`perdure resume {run.object_id}`")
    raise Park(RuntimeError(reason),
               Parked(reason, "worker_died", run._crashes, step_name, pos).draft())


def check_capabilities(run: Run, step_name: str, pos: int | str,
                       requires: set[str] | frozenset[str] | None,
                       opts: Mapping[str, Any]) -> None:
    """The step needs capabilities (by the call's ``requires``, else by
    ``@perdure.step``'s) this node lacks: ``lacking``."""
    needs = frozenset(requires if requires is not None else opts.get("requires") or ())
    if needs - run._capabilities:
        lacking(run, step_name, pos, needs)


def lacking(run: Run, step_name: str, pos: int | str, needs: frozenset[str]) -> NoReturn:
    """This node lacks a capability the step needs: say so once, and let the object go
    to a node that has it."""
    node_id = _node_id(run)
    missing = sorted(needs - run._capabilities)
    refusal = f"{node_id}:lacks:{','.join(missing)}"
    drafts = []
    if refusal not in run._refusals:
        drafts.append(CapabilityMissing.lacking(node_id, missing, step_name, pos,
                                                run._clock()).draft())
    raise Suspend(drafts, ready_at=run._clock(), status=Status.READY,
                  requires=tuple(sorted(set(run._intent.requires) | needs)),
                  reason=f"node {node_id} lacks {', '.join(missing)} for {step_name}")


def node_problem(exc: BaseException) -> str | None:
    """Why ``exc`` is this node's problem rather than the object's, or ``None``: a
    ``CannotDo`` (``NodeLacksError``: a missing credential or package), or a module
    that is not installed here (another node may have it)."""
    if isinstance(exc, CannotDo):
        return exc.reason
    if isinstance(exc, ModuleNotFoundError):
        return f"module {exc.name or str(exc)!r} is not installed on this node"
    return None


def cannot_do(run: Run, step_name: str, pos: int | str, reason: str) -> NoReturn:
    """The step (or model call, or the agent's code: ``step_name``) said this node cannot
    do it: a negative capability in memory, and the object goes to another node (the
    object's note says why until one takes it)."""
    node_id = _node_id(run)
    refusal = f"{node_id}:cannot:{step_name}"
    drafts = []
    if refusal not in run._refusals:
        drafts.append(CapabilityMissing.cannot(node_id, step_name, reason, pos,
                                               run._clock()).draft())
    said = f"node {node_id} cannot do {step_name}: {reason}"
    raise Suspend(drafts, ready_at=run._clock(), status=Status.READY, avoid_node=node_id,
                  reason=said, note=said[:500])


async def record_failure(
    run: Run,
    pos: int | str,
    step_name: str,
    attempt: int,
    previous: Sequence[Record],
    policy: RetryPolicy,
    exc: Exception,
    latency: float,
    key: str,
) -> BaseException:
    """Record a failed attempt: a final failure (committed) or a retry later (the object
    goes dormant: ``Suspend``).

    Returns the exception to raise into the agent for a final failure: the one memory
    rebuilds, on this first run as on every replay (the same type, message and
    attributes, or the same stand-in).
    """
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
    error = error_body(exc)
    if delay is None:
        error = decode(encode(error, what="step failure"))
        await run._journal.commit([StepFailed(
            pos, step_name, attempt, error, str(error_class), round(latency, 6), retry_after,
            final=True).draft()])
        return rebuild_error(step_name, dict(error))
    retry_at = run._clock() + delay
    raise Suspend(
        [
            StepFailed(pos, step_name, attempt, error, str(error_class), round(latency, 6),
                       retry_after, final=False, retry_at=retry_at).draft(),
            Dormant.retry(pos, step_name, retry_at).draft(),
        ],
        ready_at=retry_at,
        reason=f"retry {step_name} in {delay:.3f}s",
    ) from exc
