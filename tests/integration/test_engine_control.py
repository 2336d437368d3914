"""Control from outside: pause, resume, cancel, deadlines, failure thresholds, refinement."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from tests.integration.engine_support import kinds, wait_until

AppFactory = Callable[..., perdure.App]


def _register_ticker(app: perdure.App, ticks: list[int]) -> None:
    def tick(i: int) -> int:
        ticks.append(i)
        time.sleep(0.01)
        return i

    @app.agent(name="ticker")
    async def ticker(run: perdure.Run, n: int) -> int:
        total = 0
        for i in range(n):
            total += await run.step(tick, i, name=f"tick-{i}")
        return total


def test_pause_stops_at_a_command_boundary_until_resume(make_app: AppFactory) -> None:
    """A paused object stops at its next command and is not claimed until it is resumed."""
    app = make_app()
    ticks: list[int] = []
    _register_ticker(app, ticks)
    handle = app.options(object_id="tick-1").start("ticker", 150)
    with app.background_worker():
        assert wait_until(lambda: len(ticks) >= 3)
        assert app.pause("tick-1").status is perdure.Status.PAUSED
        assert wait_until(lambda: app.store.get("tick-1").lease_owner is None, timeout=3)
        stopped_at = len(ticks)
        epoch = app.get("tick-1").epoch
        time.sleep(0.8)
        assert len(ticks) == stopped_at, "a paused object runs no more steps"
        assert app.get("tick-1").epoch == epoch, "a paused object is not claimed"
        assert handle.status() is perdure.Status.PAUSED
        assert stopped_at < 150
        assert app.resume("tick-1").status is not perdure.Status.PAUSED
        assert handle.result(timeout=15) == sum(range(150))

    assert ticks == list(range(150)), "every step ran exactly once across pause and resume"


def test_paused_dormant_object_gets_its_events_after_resume(make_app: AppFactory) -> None:
    """An event sent to a paused waiting object is kept; the object takes it after resume."""
    app = make_app()

    @app.agent(name="held")
    async def held(run: perdure.Run) -> Any:
        return await run.wait_for("go")

    handle = app.options(object_id="held-1").start("held")
    with app.background_worker():
        assert wait_until(lambda: handle.info().waiting_event == "go")
        app.pause("held-1")
        app.send("held-1", "go", "now")
        epoch = handle.info().epoch
        time.sleep(0.3)
        assert handle.status() is perdure.Status.PAUSED
        assert handle.info().epoch == epoch, "a paused object is not claimed, even with an event"
        assert "event_received" not in kinds(app, "held-1")
        app.resume("held-1")
        assert handle.result(timeout=5) == "now"


def test_cancel_paused_object(make_app: AppFactory) -> None:
    """A paused object can still be cancelled; it terminates ``cancelled`` without resuming."""
    app = make_app()

    @app.agent(name="held_too")
    async def held_too(run: perdure.Run) -> Any:
        return await run.wait_for("go")

    handle = app.options(object_id="held-2").start("held_too")
    with app.background_worker():
        assert wait_until(lambda: handle.info().waiting_event == "go")
        app.pause("held-2")
        app.cancel("held-2")
        with pytest.raises(perdure.AgentCancelledError):
            handle.result(timeout=5)


def test_cancel_dormant_object_terminates_promptly(make_app: AppFactory) -> None:
    """Cancelling a dormant object ends it ``cancelled`` at once; ``result()`` says so."""
    app = make_app()

    @app.agent(name="patient")
    async def patient(run: perdure.Run) -> Any:
        return await run.wait_for("never", timeout=60)

    handle = app.options(object_id="patient-1").start("patient")
    with app.background_worker():
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT)
        asked = time.monotonic()
        app.cancel("patient-1")
        assert wait_until(lambda: handle.info().terminal, timeout=3)
        took = time.monotonic() - asked
        with pytest.raises(perdure.AgentCancelledError):
            handle.result(timeout=1)

    assert took < 1.0
    assert handle.status() is perdure.Status.CANCELLED
    last = app.history("patient-1")[-1]
    assert last.kind == perdure.Kind.TERMINATED and last.body["outcome"] == "cancelled"
    with pytest.raises(perdure.ObjectTerminatedError):
        app.send("patient-1", "never", 1)


def test_cancel_running_object_stops_at_next_command(make_app: AppFactory) -> None:
    """A running object notices the cancel and terminates before it runs all its steps."""
    app = make_app()
    ticks: list[int] = []
    _register_ticker(app, ticks)
    handle = app.options(object_id="tick-2").start("ticker", 500)
    with app.background_worker():
        assert wait_until(lambda: len(ticks) >= 3)
        app.cancel("tick-2")
        with pytest.raises(perdure.AgentCancelledError):
            handle.result(timeout=5)
        done = len(ticks)
        time.sleep(0.2)
        assert len(ticks) == done
    assert 3 <= done < 500
    assert handle.status() is perdure.Status.CANCELLED


def test_cancel_before_first_run(make_app: AppFactory) -> None:
    """An object cancelled before any node ran it terminates without running its code."""
    app = make_app()
    ran: list[bool] = []

    @app.agent(name="never_runs")
    async def never_runs(run: perdure.Run) -> None:
        ran.append(True)

    handle = app.options(object_id="early-1").start("never_runs")
    app.cancel("early-1")
    with app.background_worker(), pytest.raises(perdure.AgentCancelledError):
        handle.result(timeout=5)
    assert ran == []


def test_deadline_passed_while_running_fails_the_object(make_app: AppFactory) -> None:
    """A deadline that passes between commands terminates the object ``failed``."""
    app = make_app()
    ticks: list[int] = []
    _register_ticker(app, ticks)
    handle = app.options(object_id="tick-3", deadline=0.3).start("ticker", 1000)
    with app.background_worker(), pytest.raises(perdure.AgentFailedError, match="Deadline"):
        handle.result(timeout=5)
    assert 0 < len(ticks) < 1000
    assert app.history("tick-3")[-1].body["outcome"] == "failed"


def test_deadline_passed_while_dormant_fails_the_object(make_app: AppFactory) -> None:
    """A dormant object whose deadline passes is terminated then, not when its timer fires."""
    app = make_app()

    @app.agent(name="sleepy")
    async def sleepy(run: perdure.Run) -> str:
        await run.wait_for("go", timeout=30)
        await run.sleep(30)
        return "woke"

    handle = app.options(object_id="sleepy-1", deadline=0.5).start("sleepy")
    with app.background_worker(), pytest.raises(perdure.AgentFailedError, match="deadline"):
        handle.result(timeout=5)
    assert handle.status() is perdure.Status.FAILED


def test_failure_threshold_terminates_the_object(make_app: AppFactory) -> None:
    """More recorded step failures than ``max_failures`` terminate the object ``failed``."""
    app = make_app()
    calls: list[int] = []

    def down() -> None:
        calls.append(1)
        raise ConnectionError("down")

    @app.agent(name="doomed")
    async def doomed(run: perdure.Run) -> None:
        await run.step(down, name="down",
                       retry=perdure.RetryPolicy(base=0.02, max_attempts=10))

    handle = app.options(object_id="doomed-1", max_failures=2).start("doomed")
    expected = pytest.raises(perdure.AgentFailedError, match="failure threshold")
    with app.background_worker(), expected:
        handle.result(timeout=10)
    assert len(calls) == 3
    last = app.history("doomed-1")[-1]
    assert last.kind == perdure.Kind.TERMINATED and last.body["outcome"] == "failed"


def test_refine_appends_a_new_intent_version(make_app: AppFactory) -> None:
    """``refine(goal=...)`` appends ``intent_refined`` (version 2) and the run sees the new goal.

    The refinement wakes the dormant object to record it; the next pass of the agent
    reads the refined intent.
    """
    app = make_app()
    seen: list[tuple[int, dict[str, Any]]] = []

    @app.agent(name="goal_seeker")
    async def goal_seeker(run: perdure.Run) -> dict[str, Any]:
        seen.append((run.intent.version_no, run.intent.goal))
        await run.wait_for("check")
        return {"goal": run.intent.goal, "version": run.intent.version_no}

    handle = app.options(object_id="goal-1").start("goal_seeker")
    with app.background_worker():
        assert wait_until(lambda: handle.info().waiting_event == "check")
        app.refine("goal-1", goal={"target": "ship v2"})
        assert wait_until(lambda: "intent_refined" in kinds(app, "goal-1"), timeout=2)
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT)
        assert handle.info().waiting_event == "check", "still waiting after the refinement"
        app.send("goal-1", "check")
        result = handle.result(timeout=10)

    assert result == {"goal": {"target": "ship v2"}, "version": 2}
    assert seen == [(1, {}), (2, {"target": "ship v2"})]
    [refined] = [r for r in app.history("goal-1") if r.kind == perdure.Kind.INTENT_REFINED]
    assert refined.body["intent"]["version_no"] == 2
    assert refined.body["intent"]["goal"] == {"target": "ship v2"}
    assert refined.body["changes"] == {"goal": {"target": "ship v2"}}
    with pytest.raises(perdure.ConfigurationError, match="cannot be refined"):
        app.refine("goal-1", agent="other")


def test_refined_deadline_applies_to_a_dormant_object(make_app: AppFactory) -> None:
    """Refining a sleeping object's deadline into the near past terminates it ``failed``."""
    app = make_app()

    @app.agent(name="long_nap")
    async def long_nap(run: perdure.Run) -> str:
        await run.sleep(60)
        return "woke"

    handle = app.options(object_id="nap-2").start("long_nap")
    with app.background_worker():
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT)
        app.refine("nap-2", deadline=time.time() + 0.2)
        with pytest.raises(perdure.AgentFailedError, match="deadline"):
            handle.result(timeout=5)
