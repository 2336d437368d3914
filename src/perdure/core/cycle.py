"""The evaluation cycle: ``evaluate(view, policy, now) -> Decision``, pure and total.

Each time a node picks an object up it (1) parses the intent, (2) checks the
context against its local policy, (3) reads memory, and (4) selects exactly one
action. Nothing here does I/O; the engine performs the action around it.

A ``Decision`` carries what the engine acts on as typed fields: the ``action``, the
``code`` saying why, and the ``status`` the action leads the object to. Its ``reason``
is the same thing in words, for logs and notes; nothing decides by parsing it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from perdure.core.codec import encode
from perdure.core.events import UPDATE_EVENT, is_reserved
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import Status, outcome_status
from perdure.core.records import Kind, Record

__all__ = [
    "Action",
    "Decision",
    "LocalPolicy",
    "MemoryFacts",
    "ObjectView",
    "ReasonCode",
    "evaluate",
    "moment",
    "read_memory",
]


class Action(StrEnum):
    """The one action a cycle selects."""

    EXECUTE = "execute"  # first run of the agent
    MUTATE = "mutate"  # apply a pending intent refinement
    DELEGATE = "delegate"  # create pending child objects
    DORMANCY = "dormancy"  # nothing to do now; stay (or go) dormant
    REENTRY = "reentry"  # resume the agent from memory
    TERMINATE = "terminate"  # write (or honour) the terminal record


class ReasonCode(StrEnum):
    """Why a cycle selected its action: what the engine dispatches on."""

    TERMINATED = "terminated"  # memory already holds the terminal record
    CANCEL_REQUESTED = "cancel_requested"
    DEADLINE_PASSED = "deadline_passed"
    TOO_MANY_FAILURES = "too_many_failures"  # the intent's (or the policy's) max_failures
    POLICY_CUTOFF = "policy_cutoff"  # memory reached the policy's max_records
    SCOPE_NOT_SERVED = "scope_not_served"  # this node does not serve its trust scope
    PAUSED = "paused"
    PARKED = "parked"  # the row is parked: a person must resume it
    REFINEMENTS_PENDING = "refinements_pending"
    CHILD_RESULTS_PENDING = "child_results_pending"
    CHILDREN_FINISHED = "children_finished"  # every child a dormancy awaits has finished
    TIMER_DUE = "timer_due"
    EVENT_ARRIVED = "event_arrived"
    WAITING = "waiting"  # a dormancy still waits: for children, an event or a timer
    NOT_STARTED = "not_started"  # a delayed start whose time has not come
    FIRST_EXECUTION = "first_execution"
    RESUME = "resume"  # executed before: resume the agent from memory


@dataclass(frozen=True, slots=True)
class LocalPolicy:
    """A node's local rules. ``ref`` (name and content hash) is stamped on every record."""

    name: str = "default"
    max_failures: int = 20  # recorded step failures before the object is terminated
    max_records: int | None = None  # policy cutoff: memory budget per object
    trust_scopes: frozenset[str] | None = None  # None: serve every scope
    cancel_children: bool = True  # a parent that terminates cancels its live children
    max_crashes: int = 3  # workers dying in a row inside one step before it is parked

    @property
    def ref(self) -> str:
        """``name@hash`` identifying this exact policy."""
        body = encode(
            [
                self.name,
                self.max_failures,
                self.max_records,
                sorted(self.trust_scopes) if self.trust_scopes is not None else None,
                self.cancel_children,
                self.max_crashes,
            ]
        )
        return f"{self.name}@{hashlib.sha256(body).hexdigest()[:12]}"


@dataclass(frozen=True, slots=True)
class Dormancy:
    """An open dormancy: what the object waits for."""

    position: int | str
    reason: str  # sleep | event | retry | children | gather
    wake_at: float | None
    event: str | None
    children: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MemoryFacts:
    """What memory says, derived in one pass."""

    intent: Intent
    context: Context
    executed: bool
    failures: int
    terminated: dict[str, Any] | None
    dormancy: Dormancy | None
    parked_reason: str | None
    finished_children: frozenset[str] = frozenset()


_STEP_DONE = Kind.STEP_DONE.value


def read_memory(records: Sequence[Record]) -> MemoryFacts:
    """Derive the facts ``evaluate`` needs from an object's records."""
    first = records[0]
    intent = Intent.from_body(first.body["intent"])
    context = Context.from_body(first.body["context"])
    executed = False
    failures = 0
    terminated: dict[str, Any] | None = None
    dormancy: Dormancy | None = None
    parked: str | None = None
    finished: set[str] = set()
    on_budget = False  # the open dormancy waits (in part) for a model call's budget
    step_done = _STEP_DONE
    for rec in records[1:]:
        kind = rec.kind
        if kind == step_done and "pos" in rec.body:  # most of a long memory: the quick way
            executed, parked, dormancy, on_budget = True, None, None, False
            continue
        if kind == Kind.INTENT_REFINED:
            intent = Intent.from_body(rec.body["intent"])
            if "pos" not in rec.body:
                if dormancy is not None and on_budget:
                    dormancy, on_budget = None, False  # a budget refined: try the call again
                continue
        if kind == Kind.CHILD_FINISHED:
            finished.add(str(rec.body["child_id"]))
            continue
        if kind == Kind.CAPABILITY_MISSING or kind == Kind.EVENT_REFUSED:
            continue
        if kind == Kind.PARKED:
            parked = str(rec.body.get("reason", "needs a person"))
            continue
        if kind == Kind.TERMINATED:
            terminated = rec.body
            continue
        if kind == Kind.NONDETERMINISM:
            parked = str(rec.body.get("reason", "history mismatch"))
            continue
        executed = True
        parked = None
        if kind == Kind.STEP_FAILED:
            failures += 1
        if kind == Kind.DORMANT:
            body = rec.body
            on_budget = on_budget or body["reason"] == "budget"
            dormancy = Dormancy(
                position=body["pos"],
                reason=str(body["reason"]),
                wake_at=body.get("wake_at"),
                event=body.get("event"),
                children=tuple(body.get("children", ())),
            )
        elif "pos" in rec.body:
            dormancy, on_budget = None, False
    return MemoryFacts(intent, context, executed, failures, terminated, dormancy, parked,
                       frozenset(finished))


@dataclass(frozen=True, slots=True)
class ObjectView:
    """Everything a node knows about an object when it evaluates it."""

    records: Sequence[Record]
    cancel_requested: bool = False
    paused: bool = False
    parked: bool = False  # the store row is parked (cleared by a person's resume)
    pending_events: frozenset[str] = field(default_factory=frozenset)
    pending_refinements: int = 0
    pending_child_results: int = 0  # children's terminal signals not yet folded into memory
    facts: MemoryFacts | None = None  # read_memory(records), when the caller has it already


@dataclass(frozen=True, slots=True)
class Decision:
    """The one action selected, why (``code``, and ``reason`` in words), the status it
    leads the object to and (for dormancy) until when."""

    action: Action
    reason: str
    wake_at: float | None = None
    _: KW_ONLY
    code: ReasonCode
    #: terminate: the outcome; dormancy: dormant, paused, parked, or ready (for another
    #: node); every other action: running.
    status: Status

    @property
    def outcome(self) -> Status | None:
        """How the object ends (one of ``TERMINAL_STATUSES``) if it terminates, else ``None``."""
        return self.status if self.action is Action.TERMINATE else None


def _terminate(code: ReasonCode, reason: str, outcome: Status = Status.FAILED) -> Decision:
    return Decision(Action.TERMINATE, reason, code=code, status=outcome)


def _dormancy(code: ReasonCode, reason: str, status: Status = Status.DORMANT,
              wake_at: float | None = None) -> Decision:
    return Decision(Action.DORMANCY, reason, wake_at, code=code, status=status)


def _go(action: Action, code: ReasonCode, reason: str) -> Decision:
    return Decision(action, reason, code=code, status=Status.RUNNING)


def evaluate(view: ObjectView, policy: LocalPolicy, now: float) -> Decision:
    """Select exactly one action for the object in ``view`` at time ``now``."""
    facts = view.facts if view.facts is not None else read_memory(view.records)
    if facts.terminated is not None:
        return _terminate(
            ReasonCode.TERMINATED,
            f"already terminated ({facts.terminated.get('outcome')})",
            outcome_status(facts.terminated.get("outcome", Status.FAILED)),
        )
    if view.cancel_requested:
        if view.pending_refinements:
            # Pending refinements (and notes of who acted, the cancel's among them) are
            # folded into memory first; the cancel ends the object on the next evaluation.
            return _go(Action.MUTATE, ReasonCode.REFINEMENTS_PENDING,
                       f"{view.pending_refinements} intent refinement(s) pending")
        return _terminate(ReasonCode.CANCEL_REQUESTED, "cancelled", Status.CANCELLED)
    deadline = facts.intent.deadline
    if deadline is not None and now >= deadline:
        return _terminate(ReasonCode.DEADLINE_PASSED, "deadline passed")
    limit = facts.intent.max_failures if facts.intent.max_failures is not None else (
        policy.max_failures
    )
    if facts.failures > limit:
        return _terminate(ReasonCode.TOO_MANY_FAILURES,
                          f"failure threshold exceeded ({facts.failures} > {limit})")
    if policy.max_records is not None and len(view.records) >= policy.max_records:
        return _terminate(
            ReasonCode.POLICY_CUTOFF,
            f"policy cutoff: {len(view.records)} records reach the limit {policy.max_records}",
        )
    if policy.trust_scopes is not None and facts.context.trust_scope not in policy.trust_scopes:
        # Another node may serve it: it stays ready for one.
        return _dormancy(
            ReasonCode.SCOPE_NOT_SERVED,
            f"trust scope {facts.context.trust_scope!r} not served by this node", Status.READY,
        )
    if view.paused:
        return _dormancy(ReasonCode.PAUSED, "paused", Status.PAUSED)
    if view.parked:
        if view.pending_refinements:  # recorded, then it stays parked for a person
            return _go(Action.MUTATE, ReasonCode.REFINEMENTS_PENDING,
                       f"{view.pending_refinements} intent refinement(s) pending")
        return _dormancy(ReasonCode.PARKED,
                         f"parked: {facts.parked_reason or 'needs a person'}", Status.PARKED)
    if view.pending_refinements:
        return _go(Action.MUTATE, ReasonCode.REFINEMENTS_PENDING,
                   f"{view.pending_refinements} intent refinement(s) pending")
    if view.pending_child_results:
        return _go(Action.DELEGATE, ReasonCode.CHILD_RESULTS_PENDING,
                   f"{view.pending_child_results} child result(s) to fold into memory")
    dormancy = facts.dormancy
    if dormancy is not None:
        return _dormant(dormancy, view, facts, now)
    if not facts.executed:
        start_at = facts.intent.start_at
        if start_at is not None and now < start_at:
            return _dormancy(ReasonCode.NOT_STARTED, f"waits to start at {moment(start_at)}",
                             wake_at=start_at)
        return _go(Action.EXECUTE, ReasonCode.FIRST_EXECUTION, "first execution")
    return _go(Action.REENTRY, ReasonCode.RESUME, "resume from memory")


def moment(instant: float) -> str:
    """An instant as people read it in notes: ``2025-01-31 02:30:00Z``."""
    return datetime.fromtimestamp(instant, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _dormant(dormancy: Dormancy, view: ObjectView, facts: MemoryFacts, now: float) -> Decision:
    """An object with an open dormancy: re-enter if what it waits for is there, else wait."""
    if dormancy.children:
        if dormancy.reason == "event" and dormancy.event in view.pending_events:
            # A wait that also watches children (a schedule's): its event came first.
            return _go(Action.REENTRY, ReasonCode.EVENT_ARRIVED,
                       f"event {dormancy.event!r} arrived")
        live = [c for c in dormancy.children if c not in facts.finished_children]
        if not live:
            return _go(Action.REENTRY, ReasonCode.CHILDREN_FINISHED,
                       "every awaited child has finished")
        if dormancy.wake_at is not None and now >= dormancy.wake_at:
            return _go(Action.REENTRY, ReasonCode.TIMER_DUE, f"{dormancy.reason} timer due")
        return _dormancy(
            ReasonCode.WAITING,
            f"waiting for {len(live)} child object(s): {', '.join(live[:3])}",
            wake_at=dormancy.wake_at,
        )
    if dormancy.event is not None and dormancy.event in view.pending_events:
        return _go(Action.REENTRY, ReasonCode.EVENT_ARRIVED, f"event {dormancy.event!r} arrived")
    if (dormancy.event is not None and not is_reserved(dormancy.event)
            and UPDATE_EVENT in view.pending_events):
        # A wait for an event of the agent's own takes updates (``run.on_update``):
        # re-enter to apply it and reply (or refuse it, in a gathered branch).
        return _go(Action.REENTRY, ReasonCode.EVENT_ARRIVED, "an update arrived")
    if dormancy.wake_at is not None and now >= dormancy.wake_at:
        return _go(Action.REENTRY, ReasonCode.TIMER_DUE, f"{dormancy.reason} timer due")
    waiting = f"event {dormancy.event!r}" if dormancy.event else "timer"
    return _dormancy(ReasonCode.WAITING, f"{dormancy.reason}: waiting for {waiting}",
                     wake_at=dormancy.wake_at)
