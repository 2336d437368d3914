"""Hooks: a listener sees what a node does to an object, in order, on every store.

The events are the seam metrics, traces and the dashboard attach to, so the order and
the fields are what is pinned here: a claim before any step, each step once with its
outcome, the dormancy and the wake-up around a sleep, a failed step and its retry, the
end, commit batches that carry every append, and an integrity failure that parks an
object without a step.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from perdure.hooks import (
    CommitBatch,
    Counters,
    HookEvent,
    Hooks,
    IntegrityFailure,
    LoopLag,
    ObjectClaimed,
    ObjectDormant,
    ObjectTerminated,
    ObjectWoke,
    StepRecorded,
)
from tests.integration.engine_support import wait_until
from tests.integration.test_semantics import running

AppFactory = Callable[..., perdure.App]


class Recorder:
    """A listener keeping every event it is told, thread-safe."""

    def __init__(self) -> None:
        self.events: list[HookEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: HookEvent) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, object_id: str) -> list[HookEvent]:
        """The events naming ``object_id``, in the order they came."""
        with self._lock:
            return [e for e in self.events if getattr(e, "object_id", None) == object_id]


def _shape(event: HookEvent) -> tuple[Any, ...]:
    match event:
        case ObjectClaimed():
            return ("claimed",)
        case StepRecorded():
            return ("step", event.step.rsplit(".", 1)[-1], event.ok)
        case ObjectDormant():
            return ("dormant", event.reason)
        case ObjectWoke():
            return ("woke", event.reason)
        case ObjectTerminated():
            return ("terminated", event.status)
        case _:
            return (type(event).__name__,)


def test_a_listener_sees_each_event_of_a_run_in_order(make_app: AppFactory) -> None:
    """Claim, steps, a failed step's retry, a sleep, the wake-up and the end arrive in
    the order they happen, each with its durations; commits carry every append."""
    app = make_app()
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("first try fails")
        return "ok"

    def double(x: int) -> int:
        return 2 * x

    @app.agent(name="hooked")
    async def hooked(run: perdure.Run) -> int:
        a = await run.step(double, 1)
        await run.step(flaky, retry=perdure.RetryPolicy(base=0.05, cap=0.05))
        await run.sleep(0.1)
        return a + await run.step(double, 2)

    seen = Recorder()
    counts = Counters()
    stop_seen = app.hooks.subscribe(seen)
    counts.attach(app.hooks)
    handle = app.options(object_id="hooked-1").start("hooked")
    with running(app):
        assert handle.result(timeout=20) == 6
        assert wait_until(lambda: any(isinstance(e, ObjectTerminated)
                                      for e in seen.of("hooked-1")), timeout=5)
    stop_seen()
    shapes = [_shape(e) for e in seen.of("hooked-1")]
    assert shapes == [
        ("claimed",), ("step", "double", True), ("step", "flaky", False),
        ("dormant", "retry"),
        ("claimed",), ("woke", "retry"), ("step", "flaky", True), ("dormant", "sleep"),
        ("claimed",), ("woke", "sleep"), ("step", "double", True),
        ("terminated", "completed"),
    ]
    events = seen.of("hooked-1")
    claims = [e for e in events if isinstance(e, ObjectClaimed)]
    assert all(e.epoch > 0 and e.records > 0 and e.seconds >= 0 for e in claims)
    woke = [e for e in events if isinstance(e, ObjectWoke)]
    assert all(e.late is not None and e.late >= 0 for e in woke)
    dormant = [e for e in events if isinstance(e, ObjectDormant)]
    assert all(e.ready_at is not None for e in dormant)
    steps = [e for e in events if isinstance(e, StepRecorded)]
    assert [e.position for e in steps] == ["0", "1", "1", "3"]
    assert all(e.seconds >= 0 and e.node_id == app.node_id for e in steps)
    batches = [e for e in seen.events if isinstance(e, CommitBatch)]
    assert batches and all(b.appends >= 1 and b.refused == 0 for b in batches)
    assert counts.steps == 4 and counts.completed == 1 and counts.dormant == 2
    assert counts.appends >= len(steps) + 1 and counts.commits == len(batches)


def test_integrity_failure_is_told_and_no_step_runs(make_app: AppFactory,
                                                   backend: str) -> None:
    """Memory edited in the store: the node tells an integrity failure naming the
    record, and no claim or step of that object is reported."""
    if backend != "sqlite":
        pytest.skip("edits the SQLite file directly")
    app = make_app()
    ran: list[int] = []

    @app.agent(name="victim")
    async def victim(run: perdure.Run) -> int:
        await run.step(ran.append, 1)
        await run.wait_for("go")
        await run.step(ran.append, 2)
        return len(ran)

    seen = Recorder()
    app.hooks.subscribe(seen)
    handle = app.options(object_id="victim-1").start("victim")
    with running(app):
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT, timeout=20)
    path = app.store.url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE records SET body = CAST(? AS BLOB) WHERE object_id = ? AND seq = 2",
                 (b'{"forged":true}', "victim-1"))
    conn.commit()
    conn.close()
    before = len(seen.of("victim-1"))
    app.send("victim-1", "go", None)
    with running(app):
        assert wait_until(lambda: handle.status() is perdure.Status.PARKED, timeout=20)
    after = seen.of("victim-1")[before:]
    assert [type(e) for e in after] == [IntegrityFailure]
    failure = after[0]
    assert isinstance(failure, IntegrityFailure) and failure.seq >= 2
    assert ran == [1]


def test_no_listener_no_events_and_a_failing_listener_breaks_nothing() -> None:
    """Hooks with nobody listening are inactive; one listener raising does not keep
    the others from hearing, and unsubscribing turns the hooks inactive again."""
    hooks = Hooks()
    assert not hooks.active
    heard: list[HookEvent] = []

    def broken(event: HookEvent) -> None:
        raise RuntimeError("listener bug")

    stop_broken = hooks.subscribe(broken)
    stop_steps = hooks.subscribe(heard.append, StepRecorded)
    assert hooks.active
    step = StepRecorded("n", "o", "s", "0", True, 0.0)
    hooks.emit(step)
    hooks.emit(ObjectTerminated("n", "o", "completed", time.monotonic()))
    assert heard == [step]
    stop_broken()
    stop_steps()
    assert not hooks.active


@pytest.mark.loop_stalls_allowed
def test_the_loops_lag_is_measured_and_its_worst_logged(
        make_app: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    """A step that holds the event loop (an async step calling a blocking function, the
    mistake the measure is there to show) shows as lag to listeners and in the stop log:
    a timer due in the held 0.6 s runs at least 0.6 s less one interval (0.25 s) late."""
    app = make_app()

    @app.agent()
    async def blocker(run: perdure.Run) -> str:
        async def hold() -> None:
            time.sleep(0.6)  # blocks the loop: what a listener must be told of

        await run.step(hold)
        return "done"

    lags: list[LoopLag] = []
    app.hooks.subscribe(lags.append, LoopLag)
    caplog.set_level("INFO", logger="perdure.worker")
    with running(app):
        handle = app.start(blocker)
        assert handle.result(timeout=30) == "done"
        wait_until(lambda: any(lag.seconds >= 0.3 for lag in lags), timeout=10)
    worst = max(lag.worst for lag in lags)
    assert worst >= 0.3
    assert all(lag.interval > 0 and lag.worst >= lag.seconds >= 0 for lag in lags)
    stopped = [r.getMessage() for r in caplog.records if "worst event-loop lag" in r.getMessage()]
    assert stopped, "the node did not log its worst lag at its stop"
    assert float(stopped[-1].rsplit("lag ", 1)[1].split(" ms")[0]) >= 300
