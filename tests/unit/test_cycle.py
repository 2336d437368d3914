"""``evaluate(view, policy, now)``: every branch, precedence, purity, and the typed fields
(``code``, ``status``) the engine dispatches on."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.cycle import (
    Action,
    Decision,
    LocalPolicy,
    ObjectView,
    evaluate,
    read_memory,
)
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import TERMINAL_STATUSES, Status
from perdure.core.records import Kind, Record
from tests.unit.builders import OBJECT_ID, PROFILE, T0, TRACE_ID, chain, instantiated

POLICY = LocalPolicy()

DONE = (Kind.STEP_DONE, {"pos": 0, "cmd": "step", "name": "a", "result": 1})
FAILED = (Kind.STEP_FAILED, {"pos": 0, "cmd": "step", "name": "a", "final": False})


def sleeping(wake_at: float, pos: int = 1) -> tuple[Kind, dict[str, Any]]:
    """A dormant record for ``run.sleep`` waking at ``wake_at``."""
    return (Kind.DORMANT, {"pos": pos, "cmd": "sleep", "reason": "sleep", "wake_at": wake_at})


def waiting(event: str, wake_at: float | None = None, pos: int = 1) -> tuple[Kind, dict[str, Any]]:
    """A dormant record for ``run.wait_for(event)``."""
    return (Kind.DORMANT, {"pos": pos, "cmd": "wait", "name": event, "reason": "event",
                           "event": event, "wake_at": wake_at})


def view(*drafts: tuple[Kind, dict[str, Any]], intent: Intent | None = None,
         context: Context | None = None, **flags: Any) -> ObjectView:
    """An ObjectView over a fresh chain of ``drafts`` with view ``flags``."""
    return ObjectView(records=chain(list(drafts), first=instantiated(intent, context)), **flags)


def decide(v: ObjectView, policy: LocalPolicy = POLICY, now: float = T0) -> Decision:
    return evaluate(v, policy, now)


# -- each branch ---------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", sorted(TERMINAL_STATUSES))
def test_already_terminated_is_honoured(outcome: Status) -> None:
    """Memory with a terminated record terminates again with the recorded outcome."""
    d = decide(view(DONE, (Kind.TERMINATED, {"outcome": str(outcome)})))
    assert d.action is Action.TERMINATE
    assert d.outcome is outcome
    assert "already terminated" in d.reason


def test_terminated_wins_over_every_flag() -> None:
    """Once terminated, cancel, pause, park and pending input change nothing."""
    v = view(DONE, (Kind.TERMINATED, {"outcome": "completed"}), cancel_requested=True,
             paused=True, parked=True, pending_events=frozenset({"go"}), pending_refinements=2)
    d = decide(v)
    assert (d.action, d.outcome) == (Action.TERMINATE, Status.COMPLETED)


def test_refinements_pending_at_a_cancel_are_folded_first() -> None:
    """Pending refinements (the notes of who acted among them) are folded into memory
    before a cancel ends the object, even a paused one; then the cancel ends it."""
    d = decide(view(DONE, sleeping(T0 + 100), cancel_requested=True, paused=True,
                    pending_refinements=1))
    assert d.action is Action.MUTATE
    d = decide(view(DONE, sleeping(T0 + 100), cancel_requested=True, paused=True))
    assert (d.action, d.outcome) == (Action.TERMINATE, Status.CANCELLED)


def test_refinements_pending_on_a_parked_object_are_recorded() -> None:
    """A parked object woken by a refinement (a note of who acted) records it, then
    stays parked."""
    d = decide(view(DONE, sleeping(T0 + 100), parked=True, pending_refinements=1))
    assert d.action is Action.MUTATE
    d = decide(view(DONE, sleeping(T0 + 100), parked=True))
    assert d.status is Status.PARKED


def test_cancel_requested_terminates_as_cancelled() -> None:
    """A cancel request terminates the object as cancelled, even when paused or dormant."""
    d = decide(view(DONE, sleeping(T0 + 100), cancel_requested=True, paused=True))
    assert (d.action, d.outcome, d.reason) == (Action.TERMINATE, Status.CANCELLED, "cancelled")


def test_deadline_passed_terminates_as_failed() -> None:
    """At or after the intent's deadline the object terminates as failed."""
    intent = Intent("demo", "1", deadline=T0)
    d = decide(view(DONE, intent=intent), now=T0)
    assert (d.action, d.outcome, d.reason) == (Action.TERMINATE, Status.FAILED, "deadline passed")
    assert decide(view(DONE, intent=intent), now=T0 - 0.001).action is Action.REENTRY


def test_failure_threshold_from_policy() -> None:
    """More recorded step failures than the policy allows terminates the object."""
    policy = LocalPolicy(max_failures=2)
    assert decide(view(FAILED, FAILED), policy).action is Action.REENTRY
    d = decide(view(FAILED, FAILED, FAILED), policy)
    assert (d.action, d.outcome) == (Action.TERMINATE, Status.FAILED)
    assert "failure threshold exceeded (3 > 2)" in d.reason


def test_failure_threshold_from_intent_overrides_policy() -> None:
    """The intent's own max_failures takes precedence over the node policy."""
    intent = Intent("demo", "1", max_failures=0)
    d = decide(view(FAILED, intent=intent), LocalPolicy(max_failures=50))
    assert (d.action, d.outcome) == (Action.TERMINATE, Status.FAILED)


def test_refined_intent_changes_the_threshold() -> None:
    """An intent refinement in memory replaces the intent evaluate reads."""
    refined = Intent("demo", "1").refined({"max_failures": 0})
    refinement = (Kind.INTENT_REFINED, {"intent": refined.to_body(), "changes": {}})
    d = decide(view(FAILED, refinement), LocalPolicy(max_failures=50))
    assert d.action is Action.TERMINATE
    assert read_memory(view(refinement).records).intent.version_no == 2


def test_policy_cutoff_on_max_records() -> None:
    """A node's memory budget terminates objects whose memory reached it."""
    policy = LocalPolicy(max_records=3)
    assert decide(view(DONE), policy).action is Action.REENTRY
    d = decide(view(DONE, DONE), policy)
    assert (d.action, d.outcome) == (Action.TERMINATE, Status.FAILED)
    assert "policy cutoff" in d.reason


def test_trust_scope_not_served_stays_dormant() -> None:
    """A node that does not serve the object's trust scope leaves it alone."""
    context = Context(object_id=OBJECT_ID, trace_id=TRACE_ID, trust_scope="finance")
    d = decide(view(context=context), LocalPolicy(trust_scopes=frozenset({"default"})))
    assert d.action is Action.DORMANCY
    assert "trust scope 'finance' not served" in d.reason
    served = LocalPolicy(trust_scopes=frozenset({"finance"}))
    assert decide(view(context=context), served).action is Action.EXECUTE


def test_paused_stays_dormant() -> None:
    """A paused object is not run."""
    d = decide(view(paused=True))
    assert (d.action, d.reason) == (Action.DORMANCY, "paused")


def test_parked_stays_dormant_with_reason() -> None:
    """A parked object is not run; the reason comes from its non-determinism record."""
    parked = (Kind.NONDETERMINISM, {"reason": "history mismatch at #2"})
    d = decide(view(DONE, parked, parked=True))
    assert d.action is Action.DORMANCY
    assert d.reason == "parked: history mismatch at #2"
    assert decide(view(parked=True)).reason == "parked: needs a person"


def test_pending_refinement_mutates() -> None:
    """Pending intent refinements are applied before anything else runs."""
    d = decide(view(DONE, sleeping(T0 + 100), pending_refinements=2))
    assert d.action is Action.MUTATE
    assert "2 intent refinement(s)" in d.reason


def test_dormant_timer_not_due() -> None:
    """A sleeping object stays dormant until its timer, and says when that is."""
    d = decide(view(DONE, sleeping(T0 + 5)))
    assert (d.action, d.wake_at) == (Action.DORMANCY, T0 + 5)
    assert "waiting for timer" in d.reason


def test_dormant_timer_due() -> None:
    """At its wake time a sleeping object re-enters."""
    d = decide(view(DONE, sleeping(T0)))
    assert d.action is Action.REENTRY
    assert "timer due" in d.reason


def test_waiting_for_event_without_it() -> None:
    """An object waiting for an event stays dormant while only other events are pending."""
    d = decide(view(DONE, waiting("approval"), pending_events=frozenset({"other"})))
    assert (d.action, d.wake_at) == (Action.DORMANCY, None)
    assert "waiting for event 'approval'" in d.reason


def test_waiting_for_event_with_it() -> None:
    """An object whose awaited event is pending re-enters."""
    d = decide(view(DONE, waiting("approval"), pending_events=frozenset({"approval"})))
    assert d.action is Action.REENTRY
    assert "'approval' arrived" in d.reason


def test_waiting_for_event_with_timeout_due() -> None:
    """A wait with a timeout re-enters once the timeout is due, event or not."""
    assert decide(view(DONE, waiting("go", wake_at=T0 - 1))).action is Action.REENTRY
    d = decide(view(DONE, waiting("go", wake_at=T0 + 1)))
    assert (d.action, d.wake_at) == (Action.DORMANCY, T0 + 1)


def test_woken_dormancy_is_closed() -> None:
    """A later positioned record (woke, step) closes the dormancy: the object re-enters."""
    woke = (Kind.WOKE, {"pos": 1, "cmd": "sleep"})
    assert decide(view(DONE, sleeping(T0 + 100), woke)).action is Action.REENTRY


def test_first_execution() -> None:
    """An object with only its instantiated record executes for the first time."""
    d = decide(view())
    assert (d.action, d.reason) == (Action.EXECUTE, "first execution")


def test_intent_refinement_alone_is_not_execution() -> None:
    """Refinements and non-determinism records do not count as having executed."""
    refined = Intent("demo", "1").refined({"goal": {"x": 1}})
    d = decide(view((Kind.INTENT_REFINED, {"intent": refined.to_body()})))
    assert d.action is Action.EXECUTE


def test_otherwise_reentry() -> None:
    """An executed object with nothing pending resumes from memory."""
    d = decide(view(DONE, (Kind.PROGRESS, {"fields": {"n": 1}})))
    assert (d.action, d.reason) == (Action.REENTRY, "resume from memory")


def test_read_memory_counts_failures_and_dormancy() -> None:
    """read_memory derives failures, the open dormancy and termination from records."""
    facts = read_memory(view(FAILED, FAILED, DONE, waiting("go", pos=2)).records)
    assert facts.failures == 2
    assert facts.executed
    assert facts.dormancy is not None
    assert (facts.dormancy.event, facts.dormancy.position) == ("go", 2)
    assert facts.terminated is None


def test_policy_ref_names_the_policy_content() -> None:
    """Policies with different content get different refs; equal ones the same."""
    assert LocalPolicy().ref == LocalPolicy().ref
    assert LocalPolicy().ref.startswith("default@")
    assert LocalPolicy(max_records=5).ref != LocalPolicy().ref
    assert LocalPolicy(trust_scopes=frozenset({"a", "b"})).ref == LocalPolicy(
        trust_scopes=frozenset({"b", "a"})
    ).ref


# -- purity and totality over random memory --------------------------------------------------

EVENTS = ("go", "approval", "other")


@st.composite
def memories(draw: st.DrawFn) -> list[Record]:
    """A well-formed random memory: instantiated, then any sequence of recorded commands."""
    base = Intent(
        "demo", "1",
        deadline=draw(st.one_of(st.none(), st.none(), st.floats(T0 - 5, T0 + 60))),
        max_failures=draw(st.none() | st.integers(0, 4)),
    )
    intent = base
    scope = draw(st.sampled_from(["default", "finance"]))
    context = Context(object_id=OBJECT_ID, trace_id=TRACE_ID, trust_scope=scope)
    drafts: list[tuple[Kind, dict[str, Any]]] = []
    for pos in range(draw(st.integers(0, 8))):
        choice = draw(st.sampled_from(
            ["done", "done", "failed", "sleep", "wait", "wait", "woke", "event", "value",
             "progress", "refined", "nondeterminism", "terminated"]
        ))
        step = {"pos": pos, "cmd": "step", "name": f"s{pos}"}
        if choice == "done":
            drafts.append((Kind.STEP_DONE, {**step, "result": pos}))
        elif choice == "failed":
            drafts.append((Kind.STEP_FAILED, {**step, "final": draw(st.booleans())}))
        elif choice == "sleep":
            drafts.append(sleeping(draw(st.floats(T0 - 10, T0 + 10)), pos))
        elif choice == "wait":
            drafts.append(waiting(draw(st.sampled_from(EVENTS)),
                                  draw(st.none() | st.floats(T0 - 10, T0 + 10)), pos))
        elif choice == "woke":
            drafts.append((Kind.WOKE, {"pos": pos, "cmd": "sleep"}))
        elif choice == "event":
            drafts.append((Kind.EVENT_RECEIVED, {"pos": pos, "cmd": "wait", "payload": pos}))
        elif choice == "value":
            drafts.append((Kind.VALUE, {"pos": pos, "cmd": "now", "value": T0}))
        elif choice == "progress":
            drafts.append((Kind.PROGRESS, {"fields": {"n": pos}}))
        elif choice == "refined":
            intent = intent.refined({"max_failures": draw(st.integers(0, 4))})
            drafts.append((Kind.INTENT_REFINED, {"intent": intent.to_body()}))
        elif choice == "nondeterminism":
            drafts.append((Kind.NONDETERMINISM, {"reason": "mismatch"}))
        else:
            outcome = draw(st.sampled_from(sorted(TERMINAL_STATUSES)))
            drafts.append((Kind.TERMINATED, {"outcome": str(outcome)}))
    return chain(drafts, first=instantiated(base, context))



def rarely() -> st.SearchStrategy[bool]:
    """True about one time in five, so later branches of the cycle are reached too."""
    return st.integers(0, 4).map(lambda n: n == 2)


views = st.builds(
    ObjectView,
    records=memories(),
    cancel_requested=rarely(),
    paused=rarely(),
    parked=rarely(),
    pending_events=st.frozensets(st.sampled_from(EVENTS)),
    pending_refinements=st.integers(0, 4).map(lambda n: max(0, n - 2)),
)
policies = st.builds(
    LocalPolicy,
    max_failures=st.integers(0, 5),
    max_records=st.one_of(st.none(), st.none(), st.integers(1, 12)),
    trust_scopes=st.one_of(st.none(), st.none(), st.just(frozenset({"default"}))),
)


@PROFILE
@given(v=views, policy=policies, now=st.floats(T0 - 20, T0 + 20))
def test_evaluate_is_pure_and_total(v: ObjectView, policy: LocalPolicy, now: float) -> None:
    """For any well-formed memory: no exception, one action, same inputs give the same answer."""
    first = evaluate(v, policy, now)
    again = evaluate(v, policy, now)
    assert first == again
    assert isinstance(first, Decision)
    assert first.action in set(Action)
    assert first.reason
    assert (first.outcome is not None) == (first.action is Action.TERMINATE)
    if first.wake_at is not None:
        assert first.action is Action.DORMANCY
    facts = read_memory(v.records)
    if facts.terminated is not None or (v.cancel_requested and not v.pending_refinements):
        assert first.action is Action.TERMINATE
    if facts.terminated is None and v.cancel_requested and v.pending_refinements:
        assert first.action is Action.MUTATE  # folded first; the cancel ends it next
    if first.action in (Action.EXECUTE, Action.REENTRY):
        assert not (v.paused or v.parked or v.cancel_requested)
    if first.action is Action.MUTATE:
        assert v.pending_refinements and (v.cancel_requested or not v.paused)
    if first.action is Action.EXECUTE:
        assert not facts.executed


@PROFILE
@given(v=views, now=st.floats(T0 - 20, T0 + 20))
def test_evaluate_does_not_touch_its_inputs(v: ObjectView, now: float) -> None:
    """Evaluating leaves the view's records exactly as they were."""
    before = [(r.seq, r.hash, dict(r.body)) for r in v.records]
    evaluate(v, POLICY, now)
    assert [(r.seq, r.hash, dict(r.body)) for r in v.records] == before
