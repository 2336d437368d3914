"""The typed fields of a ``Decision``: every branch of ``evaluate`` names its ``code`` and the
``status`` it leads to, so the engine never reads the words; and the terminal statuses."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.cycle import Action, LocalPolicy, ObjectView, ReasonCode, evaluate
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import TERMINAL_STATUSES, Status, outcome_status
from perdure.core.records import Kind
from tests.unit.builders import OBJECT_ID, PROFILE, T0, TRACE_ID, chain, instantiated
from tests.unit.test_cycle import DONE, FAILED, policies, sleeping, views, waiting

POLICY = LocalPolicy()


def view(*drafts: tuple[Kind, dict[str, Any]], intent: Intent | None = None,
         context: Context | None = None, **flags: Any) -> ObjectView:
    """An ObjectView over a fresh chain of ``drafts`` with view ``flags``."""
    return ObjectView(records=chain(list(drafts), first=instantiated(intent, context)), **flags)


FINANCE = Context(object_id=OBJECT_ID, trace_id=TRACE_ID, trust_scope="finance")
DELEGATED = (Kind.DORMANT, {"pos": 1, "cmd": "gather", "reason": "children",
                            "children": ["c1"], "wake_at": None})
CHILD_DONE = (Kind.CHILD_FINISHED, {"child_id": "c1", "outcome": "completed"})

# (view, policy, now) -> the action, code and status ``evaluate`` must give.
CASES: dict[str, tuple[ObjectView, LocalPolicy, float, Action, ReasonCode, Status]] = {
    "terminated": (view(DONE, (Kind.TERMINATED, {"outcome": "cancelled"})), POLICY, T0,
                   Action.TERMINATE, ReasonCode.TERMINATED, Status.CANCELLED),
    "terminated without outcome": (view((Kind.TERMINATED, {})), POLICY, T0,
                                   Action.TERMINATE, ReasonCode.TERMINATED, Status.FAILED),
    "cancel": (view(DONE, cancel_requested=True), POLICY, T0,
               Action.TERMINATE, ReasonCode.CANCEL_REQUESTED, Status.CANCELLED),
    "deadline": (view(DONE, intent=Intent("demo", "1", deadline=T0)), POLICY, T0,
                 Action.TERMINATE, ReasonCode.DEADLINE_PASSED, Status.FAILED),
    "failures": (view(FAILED, FAILED), LocalPolicy(max_failures=1), T0,
                 Action.TERMINATE, ReasonCode.TOO_MANY_FAILURES, Status.FAILED),
    "cutoff": (view(DONE, DONE), LocalPolicy(max_records=3), T0,
               Action.TERMINATE, ReasonCode.POLICY_CUTOFF, Status.FAILED),
    "scope": (view(context=FINANCE), LocalPolicy(trust_scopes=frozenset({"default"})), T0,
              Action.DORMANCY, ReasonCode.SCOPE_NOT_SERVED, Status.READY),
    "paused": (view(DONE, paused=True), POLICY, T0,
               Action.DORMANCY, ReasonCode.PAUSED, Status.PAUSED),
    "parked": (view(DONE, parked=True), POLICY, T0,
               Action.DORMANCY, ReasonCode.PARKED, Status.PARKED),
    "refinements": (view(DONE, pending_refinements=1), POLICY, T0,
                    Action.MUTATE, ReasonCode.REFINEMENTS_PENDING, Status.RUNNING),
    "child results": (view(DONE, pending_child_results=2), POLICY, T0,
                      Action.DELEGATE, ReasonCode.CHILD_RESULTS_PENDING, Status.RUNNING),
    "children finished": (view(DELEGATED, CHILD_DONE), POLICY, T0,
                          Action.REENTRY, ReasonCode.CHILDREN_FINISHED, Status.RUNNING),
    "children awaited": (view(DELEGATED), POLICY, T0,
                         Action.DORMANCY, ReasonCode.WAITING, Status.DORMANT),
    "event arrived": (view(DONE, waiting("go"), pending_events=frozenset({"go"})), POLICY, T0,
                      Action.REENTRY, ReasonCode.EVENT_ARRIVED, Status.RUNNING),
    "event awaited": (view(DONE, waiting("go")), POLICY, T0,
                      Action.DORMANCY, ReasonCode.WAITING, Status.DORMANT),
    "timer due": (view(DONE, sleeping(T0)), POLICY, T0,
                  Action.REENTRY, ReasonCode.TIMER_DUE, Status.RUNNING),
    "timer not due": (view(DONE, sleeping(T0 + 5)), POLICY, T0,
                      Action.DORMANCY, ReasonCode.WAITING, Status.DORMANT),
    "not started": (view(intent=Intent("demo", "1", start_at=T0 + 5)), POLICY, T0,
                    Action.DORMANCY, ReasonCode.NOT_STARTED, Status.DORMANT),
    "started": (view(intent=Intent("demo", "1", start_at=T0)), POLICY, T0,
                Action.EXECUTE, ReasonCode.FIRST_EXECUTION, Status.RUNNING),
    "watched wait, event first": (
        view(DONE, (Kind.DORMANT, {"pos": 1, "cmd": "wait", "reason": "event", "name": "go",
                                   "event": "go", "wake_at": T0 + 5, "children": ["c1"]}),
             pending_events=frozenset({"go"})), POLICY, T0,
        Action.REENTRY, ReasonCode.EVENT_ARRIVED, Status.RUNNING),
    "first execution": (view(), POLICY, T0,
                        Action.EXECUTE, ReasonCode.FIRST_EXECUTION, Status.RUNNING),
    "resume": (view(DONE), POLICY, T0, Action.REENTRY, ReasonCode.RESUME, Status.RUNNING),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_branch_names_its_code_and_status(case: str) -> None:
    """Each branch of the cycle gives its own code and the status its action leads to."""
    v, policy, now, action, code, status = CASES[case]
    d = evaluate(v, policy, now)
    assert (d.action, d.code, d.status) == (action, code, status)
    assert d.outcome == (status if action is Action.TERMINATE else None)


def test_every_code_is_reached() -> None:
    """The table above covers every reason code, so none is left untested."""
    assert {case[4] for case in CASES.values()} == set(ReasonCode)


def test_the_words_stay_as_they_were() -> None:
    """The human-readable reasons (logs and notes) did not change with the codes."""
    assert evaluate(CASES["paused"][0], POLICY, T0).reason == "paused"
    assert evaluate(CASES["parked"][0], POLICY, T0).reason == "parked: needs a person"
    scope = evaluate(*CASES["scope"][:3])
    assert scope.reason == "trust scope 'finance' not served by this node"
    assert evaluate(CASES["cancel"][0], POLICY, T0).reason == "cancelled"


@PROFILE
@given(v=views, policy=policies, now=st.floats(T0 - 20, T0 + 20))
def test_status_follows_the_action(v: ObjectView, policy: LocalPolicy, now: float) -> None:
    """For any memory: terminate leads to an ending, dormancy to a status off the node,
    every other action keeps the object running here."""
    d = evaluate(v, policy, now)
    if d.action is Action.TERMINATE:
        assert d.status in TERMINAL_STATUSES
        assert d.outcome is d.status
    elif d.action is Action.DORMANCY:
        assert d.status in {Status.DORMANT, Status.PAUSED, Status.PARKED, Status.READY}
        assert d.outcome is None
    else:
        assert d.status is Status.RUNNING
        assert d.outcome is None
    if d.wake_at is not None:
        assert d.status is Status.DORMANT


def test_terminal_statuses_are_the_three_endings() -> None:
    """Completed, failed and cancelled end an object; the rest do not."""
    endings = {Status.COMPLETED, Status.FAILED, Status.CANCELLED}
    assert endings == TERMINAL_STATUSES
    assert {s for s in Status if s.terminal} == endings
    assert "failed" in TERMINAL_STATUSES  # a plain stored string is found too


@pytest.mark.parametrize("text", ["completed", "failed", "cancelled"])
def test_outcome_status_reads_an_ending(text: str) -> None:
    """A terminated record's outcome reads as its status member."""
    assert outcome_status(text) is Status(text)


@pytest.mark.parametrize("text", ["running", "dormant", "Completed", "", None, 3, ["failed"]])
def test_outcome_status_refuses_anything_else(text: object) -> None:
    """A status that is not an ending, or no status at all, is not an outcome."""
    with pytest.raises(ValueError, match="is not a valid outcome"):
        outcome_status(text)


def test_a_stored_outcome_that_is_no_ending_is_refused() -> None:
    """Memory whose terminal record names no ending is not taken for one."""
    with pytest.raises(ValueError, match="'running' is not a valid outcome"):
        evaluate(view(DONE, (Kind.TERMINATED, {"outcome": "running"})), POLICY, T0)
