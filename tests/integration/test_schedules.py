"""Delayed starts and schedules on both stores, with real workers: fires, overlap
policies, catch-up after downtime, controls, bad input, and worker processes killed
with SIGKILL while a schedule fires."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import perdure
from perdure.core.records import Kind
from perdure.core.schedules import PLAN_STEP, run_id
from perdure.errors import (
    ConfigurationError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    ScheduleError,
    UnknownAgentError,
)
from tests.integration.engine_support import count_lines, kill_process, wait_until
from tests.integration.schedule_support import (
    delegated,
    fires_of,
    register,
    start_worker,
)

AppFactory = Callable[..., perdure.App]
WAIT = 20.0


def _app(make_app: AppFactory) -> perdure.App:
    return register(make_app(lease_seconds=2.0, poll_interval=0.01))


def _fire(object_id: str) -> float:
    """The fire time a run's id names."""
    stamp = object_id.split("@", 1)[1]
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


# -- delayed start ------------------------------------------------------------------


def test_a_delayed_start_is_created_now_and_runs_no_sooner(make_app: AppFactory) -> None:
    app = _app(make_app)
    with app.background_worker():
        asked = time.time()
        handle = app.options(object_id="later-1", delay=1.5).start("clock")
        assert handle.created
        info = app.get("later-1")
        assert info.status is perdure.Status.DORMANT
        assert info.note is not None and info.note.startswith("waits to start at ")
        assert info.ready_at is not None and info.ready_at >= asked + 1.5
        # A control event wakes it before its time: it stays dormant, saying why.
        app.refine("later-1", goal={"why": "early wake"})
        assert wait_until(lambda: app.get("later-1").phase == "dormancy", WAIT)
        assert app.get("later-1").note == info.note
        again = app.options(object_id="later-1", delay=99).start("clock")
        assert not again.created and again.differs is None
        ran_at = handle.result(timeout=WAIT)
    assert ran_at >= info.ready_at
    assert app.history("later-1")[0].body["intent"]["start_at"] == info.ready_at
    assert app.verify("later-1").ok


def test_start_at_takes_an_aware_datetime_and_the_deadline_counts_from_it(
        make_app: AppFactory) -> None:
    app = _app(make_app)
    when = datetime.now(UTC) + timedelta(seconds=1)
    handle = app.options(object_id="at-1", start_at=when, deadline=60).start("clock")
    intent = app.history("at-1")[0].body["intent"]
    assert intent["start_at"] == when.timestamp()
    assert intent["deadline"] == pytest.approx(when.timestamp() + 60)
    with app.background_worker():
        assert handle.result(timeout=WAIT) >= when.timestamp()


@pytest.mark.parametrize("options", [{"delay": -1}, {"delay": "soon"},
                                     {"start_at": datetime(2030, 1, 1)},
                                     {"start_at": "tomorrow"}, {"delay": 1, "start_at": 5},
                                     {"start_at": 1e12}])  # past the year 9999
def test_bad_start_times_store_nothing(make_app: AppFactory,
                                       options: dict[str, object]) -> None:
    app = _app(make_app)
    with pytest.raises(ConfigurationError):
        app.options(object_id="bad-1", **options).start("clock")  # type: ignore[arg-type]
    assert app.list() == []


# -- schedules ------------------------------------------------------------------------


def test_an_interval_schedule_fires_again_and_again(make_app: AppFactory,
                                                    tmp_path: Path) -> None:
    app = _app(make_app)
    marks = str(tmp_path / "marks")
    handle = app.schedule("tick", "tick", marks, interval=1)
    assert handle.created and handle.object_id == "schedule:tick"
    assert app.schedule("tick", "tick", marks, interval=1).created is False
    other = app.schedule("tick", "tick", marks, interval=2)
    assert other.differs is not None and "interval" in other.differs
    with app.background_worker():
        assert wait_until(lambda: count_lines(marks) >= 3, WAIT)
        info = handle.info()
    runs = fires_of(app, "tick")
    assert len(runs) >= 3 and runs == sorted(set(delegated(app, "tick")))
    fires = [_fire(r) for r in runs]
    assert all(f == int(f) for f in fires) and len(set(fires)) == len(fires)
    assert info.state == "active" and info.last_run in runs
    assert info.next_fire is not None and info.last_fire is not None
    assert info.next_fire > info.last_fire
    assert [s.name for s in app.schedules()] == ["tick"]
    assert app.verify("schedule:tick").ok


def _live(app: perdure.App, name: str) -> list[str]:
    return [i.object_id for i in app.list(parent=f"schedule:{name}") if not i.terminal]


def test_skip_starts_nothing_while_the_previous_run_is_live(make_app: AppFactory) -> None:
    app = _app(make_app)
    handle = app.schedule("s", "hold", interval=1, overlap="skip")
    with app.background_worker():
        assert wait_until(lambda: len(fires_of(app, "s")) == 1, WAIT)
        assert wait_until(lambda: handle.info().skipped >= 2, WAIT)
        first = fires_of(app, "s")
        assert len(first) == 1
        app.send(first[0], "release", 1)
        assert wait_until(lambda: len(fires_of(app, "s")) == 2, WAIT)
        second = next(r for r in fires_of(app, "s") if r != first[0])
        assert _fire(second) >= _fire(first[0]) + 3


def test_buffer_one_starts_the_buffered_fire_when_the_live_run_ends(
        make_app: AppFactory) -> None:
    app = _app(make_app)
    handle = app.schedule("b", "hold", interval=1, overlap="buffer_one")
    with app.background_worker():
        assert wait_until(lambda: len(fires_of(app, "b")) == 1, WAIT)
        first = fires_of(app, "b")[0]
        # one fire buffered, the next one dropped
        assert wait_until(lambda: handle.info().skipped >= 1, WAIT)
        buffered = handle.info().buffered
        assert buffered is not None and buffered > _fire(first)
        assert fires_of(app, "b") == [first]
        app.send(first, "release", 1)
        assert wait_until(lambda: len(fires_of(app, "b")) == 2, WAIT)
        assert fires_of(app, "b")[1] == run_id("b", buffered)


def test_allow_all_and_cancel_previous(make_app: AppFactory) -> None:
    app = _app(make_app)
    app.schedule("all", "hold", interval=1, overlap="allow_all")
    app.schedule("cancel", "hold", interval=1, overlap="cancel_previous")
    with app.background_worker():
        assert wait_until(lambda: len(_live(app, "all")) >= 3, WAIT)
        assert wait_until(lambda: len(fires_of(app, "cancel")) >= 3, WAIT)
        assert wait_until(lambda: len(_live(app, "cancel")) <= 1, WAIT)
        live = _live(app, "all")
        app.schedule_handle("all").delete()  # its live runs go on
        assert wait_until(lambda: app.get("schedule:all").terminal, WAIT)
        assert all(not app.get(r).terminal for r in live)
    ended = [app.get(r).status for r in fires_of(app, "cancel")[:-1]]
    assert set(ended) == {perdure.Status.CANCELLED}


def test_after_downtime_one_run_catches_up_by_default(make_app: AppFactory,
                                                      tmp_path: Path) -> None:
    app = _app(make_app)
    marks = str(tmp_path / "marks")
    handle = app.schedule("c", "tick", marks, interval=1)
    windowed = app.schedule("w", "tick", marks, interval=1, catch_up_window=3.5,
                            overlap="allow_all")
    with app.background_worker():
        assert wait_until(lambda: bool(fires_of(app, "c") and fires_of(app, "w")), WAIT)
    before_c, before_w = fires_of(app, "c"), fires_of(app, "w")
    down_from = max(_fire(r) for r in before_c + before_w)
    assert wait_until(lambda: time.time() > down_from + 6.5, WAIT)  # six fires missed
    back = time.time()
    with app.background_worker():
        assert wait_until(lambda: handle.info().dropped >= 5, WAIT)
        assert wait_until(lambda: windowed.info().dropped >= 2, WAIT)
        # the runs those plans started exist (a plan is recorded before its runs)
        assert wait_until(lambda: handle.info().started == len(fires_of(app, "c")), WAIT)
        assert wait_until(lambda: windowed.info().started == len(fires_of(app, "w")), WAIT)
    # What the first look after the return started, from the plans memory recorded.
    look_c, look_w = _first_look_after(app, "c", back), _first_look_after(app, "w", back)
    missed_c = [_fire(r) for r in fires_of(app, "c") if down_from < _fire(r) <= look_c]
    missed_w = [_fire(r) for r in fires_of(app, "w") if down_from < _fire(r) <= look_w]
    assert missed_c == [float(int(look_c))]  # the latest missed fire, once for all
    assert missed_w == [f for f in range(int(down_from) + 1, int(look_w) + 1)
                        if f >= look_w - 3.5]  # those within the window, not the others
    assert len(missed_w) < int(look_w) - int(down_from)


def _first_look_after(app: perdure.App, name: str, moment: float) -> float:
    """When the schedule's first plan after ``moment`` looked."""
    looks = [float(r.body["result"]["now"]) for r in app.history(f"schedule:{name}")
             if r.kind == Kind.STEP_DONE and r.body["name"] == PLAN_STEP]
    return min(t for t in looks if t > moment)


def test_pause_resume_trigger_backfill_delete(make_app: AppFactory, tmp_path: Path) -> None:
    app = _app(make_app)
    marks = str(tmp_path / "marks")
    handle = app.schedule("p", "tick", marks, cron="0 0 1 1 *", timezone="Europe/Paris",
                          overlap="allow_all")
    with app.background_worker():
        handle.trigger()
        assert wait_until(lambda: count_lines(marks) == 1, WAIT)
        assert fires_of(app, "p")[0].endswith("-manual")
        handle.pause()
        assert wait_until(lambda: handle.info().state == "paused", WAIT)
        assert handle.info().next_fire is None
        handle.resume()
        assert wait_until(lambda: handle.info().state == "active", WAIT)
        handle.update(cron="0 12 * * *")
        assert wait_until(lambda: handle.info().spec.cron == "0 12 * * *", WAIT)
        # noon Paris on 2024-01-01, -02 and -03 (not the 4th: the end is excluded)
        start = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
        assert handle.backfill(start, start + 3 * 86400 + 11 * 3600) == 3
        assert wait_until(lambda: count_lines(marks) == 4, WAIT)
        assert handle.backfill(start, start + 86400) == 1  # ran already: not again
        handle.delete()
        assert wait_until(lambda: handle.info().state == "deleted", WAIT)
    assert sorted(fires_of(app, "p"))[:3] == [
        "p@2024-01-01T11:00:00Z", "p@2024-01-02T11:00:00Z", "p@2024-01-03T11:00:00Z"]
    assert count_lines(marks) == 4 and app.get("schedule:p").status is perdure.Status.COMPLETED
    with pytest.raises(ObjectTerminatedError):
        handle.trigger()
    with pytest.raises(ObjectNotFoundError):
        app.schedule_handle("nope")
    assert app.verify("schedule:p").ok


@pytest.mark.parametrize(("agent", "options", "error"), [
    ("tick", {"cron": "0 25 * * *"}, ScheduleError),
    ("tick", {"cron": "0 * * * *", "timezone": "Mars/Olympus"}, ScheduleError),
    ("tick", {"interval": -1}, ScheduleError),
    ("tick", {"interval": 5, "cron": "* * * * *"}, ScheduleError),
    ("tick", {}, ScheduleError),
    ("tick", {"interval": 5, "overlap": "queue"}, ScheduleError),
    ("nobody", {"interval": 5}, UnknownAgentError),
])
def test_bad_schedules_store_nothing(make_app: AppFactory, agent: str,
                                     options: dict[str, object], error: type[Exception]
                                     ) -> None:
    app = _app(make_app)
    with pytest.raises(error):
        app.schedule("bad", agent, "m", **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        app.schedule("bad", "tick", "m", "extra", interval=5)  # tick takes one argument
    assert app.list() == [] and app.schedules() == []


def _kill_campaign(store_url: str, key_dir: Path, tmp_path: Path, kills: int) -> None:
    """Kill the only worker with SIGKILL at random moments while a schedule fires every
    second; the schedule's memory and its runs must agree, each fire one run."""
    app = register(perdure.App(store=store_url, key_dir=key_dir))
    marks = str(tmp_path / "marks")
    app.schedule("k", "tick", marks, interval=1, overlap="allow_all", catch_up_window=30)
    log = tmp_path / "worker.log"
    rng = random.Random(7)
    for _ in range(kills):
        proc = start_worker(store_url, key_dir, log)
        try:
            seen = len(fires_of(app, "k"))
            assert wait_until(lambda seen=seen: len(fires_of(app, "k")) > seen,  # type: ignore[misc]
                              WAIT), log.read_text()
            time.sleep(rng.uniform(0.0, 0.4))  # a random moment to kill it
        finally:
            kill_process(proc)
    proc = start_worker(store_url, key_dir, log)
    try:
        assert wait_until(lambda: set(delegated(app, "k")) == set(fires_of(app, "k"))
                          and all(app.get(r).terminal for r in fires_of(app, "k")),
                          WAIT), log.read_text()
    finally:
        kill_process(proc)
    started = delegated(app, "k")
    assert len(started) == len(set(started)), "a run was delegated twice"
    assert set(started) == set(fires_of(app, "k"))
    fires = [_fire(r) for r in started]
    assert fires == sorted(fires) and len(set(fires)) == len(fires)
    info = app.schedule_handle("k").info()
    assert info.state == "active" and app.get("schedule:k").status is not \
        perdure.Status.PARKED
    assert app.verify("schedule:k").ok


def test_a_fire_starts_one_run_when_workers_are_killed(store_url: str, key_dir: Path,
                                                       tmp_path: Path) -> None:
    _kill_campaign(store_url, key_dir, tmp_path, kills=4)


@pytest.mark.slow
def test_a_long_kill_campaign(store_url: str, key_dir: Path, tmp_path: Path) -> None:
    _kill_campaign(store_url, key_dir, tmp_path, kills=25)
