"""A schedule's rules, pure: which fires are due, catch-up after downtime, overlap
policies, controls, and the spec's checks."""

from __future__ import annotations

from typing import Any

import pytest

from perdure.core.schedules import (
    ScheduleSpec,
    ScheduleState,
    apply_control,
    control_payload,
    jitter_of,
    plan,
    run_id,
)
from perdure.errors import ScheduleError

T0 = 1_700_000_000.0  # a multiple of 10 and of 60


def spec(**options: Any) -> ScheduleSpec:
    base: dict[str, Any] = {"interval": 10}
    base.update(options)
    return ScheduleSpec.make("nightly", "job", (1,), {}, **base)


def never(_: str) -> bool:
    return False


def test_a_due_fire_starts_one_run_named_by_it() -> None:
    made = plan(spec(), ScheduleState(cursor=T0 - 5), T0 + 1, set(), never)
    assert [s["id"] for s in made.start] == ["nightly@2023-11-14T22:13:20Z"]
    assert made.start[0]["fire"] == T0 == made.start[0]["start_at"]
    assert made.next_fire == T0 + 10 and made.state.cursor == T0 + 1
    assert made.state.running == ("nightly@2023-11-14T22:13:20Z",)
    again = plan(spec(), made.state, T0 + 2, set(), never)  # nothing new is due
    assert again.start == () and again.next_fire == T0 + 10


def test_after_downtime_only_the_latest_missed_fire_runs_by_default() -> None:
    made = plan(spec(), ScheduleState(cursor=T0 - 1), T0 + 235, set(), never)
    assert [s["fire"] for s in made.start] == [T0 + 230]
    assert made.state.dropped == 23  # T0 .. T0+220


def test_a_catch_up_window_runs_the_fires_within_it_oldest_first() -> None:
    made = plan(spec(catch_up_window=45, overlap="allow_all"), ScheduleState(cursor=T0 - 1),
                T0 + 235, set(), never)
    assert [s["fire"] for s in made.start] == [T0 + 190, T0 + 200, T0 + 210, T0 + 220,
                                               T0 + 230]
    assert made.state.dropped == 19


def test_a_cron_schedule_catches_up_once_too() -> None:
    hourly = spec(interval=None, cron="0 * * * *", timezone="Europe/Paris")
    made = plan(hourly, ScheduleState(cursor=T0), T0 + 86400, set(), never)
    assert len(made.start) == 1 and made.state.dropped == 23


def test_skip_does_not_start_while_the_previous_run_is_live() -> None:
    first = plan(spec(), ScheduleState(cursor=T0 - 1), T0, set(), never)
    live = plan(spec(), first.state, T0 + 10, set(), never)
    assert live.start == () and live.state.skipped == 1
    ended = plan(spec(), live.state, T0 + 20, {first.start[0]["id"]}, never)
    assert [s["fire"] for s in ended.start] == [T0 + 20]


def test_buffer_one_keeps_one_fire_until_the_live_run_ends() -> None:
    s = spec(overlap="buffer_one")
    first = plan(s, ScheduleState(cursor=T0 - 1), T0, set(), never)
    rid = first.start[0]["id"]
    held = plan(s, first.state, T0 + 10, set(), never)
    assert held.start == () and held.state.buffered == {"fire": T0 + 10}
    assert held.watch == (rid,)  # its end wakes the schedule
    dropped = plan(s, held.state, T0 + 20, set(), never)
    assert dropped.start == () and dropped.state.skipped == 1
    assert dropped.state.buffered == {"fire": T0 + 10}
    released = plan(s, dropped.state, T0 + 25, {rid}, never)
    assert [x["fire"] for x in released.start] == [T0 + 10]
    assert released.state.buffered is None and released.watch == ()


def test_allow_all_starts_every_fire() -> None:
    s = spec(overlap="allow_all")
    first = plan(s, ScheduleState(cursor=T0 - 1), T0, set(), never)
    second = plan(s, first.state, T0 + 10, set(), never)
    assert len(second.start) == 1 and len(second.state.running) == 2


def test_cancel_previous_cancels_the_live_run_and_starts_the_new_one() -> None:
    s = spec(overlap="cancel_previous")
    first = plan(s, ScheduleState(cursor=T0 - 1), T0, set(), never)
    second = plan(s, first.state, T0 + 10, set(), never)
    assert second.cancel == (first.start[0]["id"],)
    assert [x["fire"] for x in second.start] == [T0 + 10]
    assert second.state.running == (second.start[0]["id"],)


def test_a_fire_whose_run_exists_is_not_started_again() -> None:
    done = run_id("nightly", T0)
    made = plan(spec(), ScheduleState(cursor=T0 - 1), T0, set(), {done}.__contains__)
    assert made.start == () and made.state.skipped == 1


def test_pause_drops_fires_and_resume_does_not_catch_up() -> None:
    s = spec()
    paused = apply_control(s, ScheduleState(cursor=T0 - 1), control_payload("pause", T0))[1]
    held = plan(s, paused, T0 + 1000, set(), never)
    assert held.start == () and held.next_fire is None
    resumed = apply_control(s, held.state, control_payload("resume", T0 + 2000))[1]
    after = plan(s, resumed, T0 + 2001, set(), never)
    assert after.start == () and after.next_fire == T0 + 2010


def test_trigger_and_backfill_queue_fires_run_by_the_overlap_policy() -> None:
    s = spec(overlap="allow_all")
    state = ScheduleState(cursor=T0 + 100)
    state = apply_control(s, state, control_payload("trigger", T0 + 100.5))[1]
    state = apply_control(s, state, control_payload("backfill", T0, start=T0, end=T0 + 30))[1]
    made = plan(s, state, T0 + 101, set(), never)
    assert [x["id"] for x in made.start] == [
        "nightly@2023-11-14T22:15:00.500000Z-manual", run_id("nightly", T0),
        run_id("nightly", T0 + 10), run_id("nightly", T0 + 20)]  # [start, end)
    skipping = apply_control(spec(), ScheduleState(cursor=T0 + 100),
                             control_payload("backfill", T0, start=T0, end=T0 + 30))[1]
    assert len(plan(spec(), skipping, T0 + 101, set(), never).start) == 1


def test_update_changes_the_spec_but_not_the_name_and_delete_ends() -> None:
    s = spec()
    new = spec(interval=60, overlap="allow_all").to_body()
    new["name"] = "other"
    updated, _ = apply_control(s, ScheduleState(cursor=T0), control_payload(
        "update", T0, spec=new))
    assert updated.interval == 60 and updated.name == "nightly"
    _, gone = apply_control(s, ScheduleState(cursor=T0), control_payload("delete", T0))
    assert gone.deleted and plan(s, gone, T0 + 100, set(), never).start == ()
    assert apply_control(s, ScheduleState(cursor=T0), {"op": "nonsense"})[0] is s


def test_jitter_is_the_same_everywhere_and_within_bounds() -> None:
    delays = [jitter_of("n", T0 + 10 * i, 30) for i in range(50)]
    assert all(0 <= d < 30 for d in delays) and len(set(delays)) > 40
    assert delays == [jitter_of("n", T0 + 10 * i, 30) for i in range(50)]
    made = plan(spec(jitter=30), ScheduleState(cursor=T0 - 1), T0, set(), never)
    assert made.start[0]["start_at"] == T0 + jitter_of("nightly", T0, 30)


def test_state_and_spec_read_back() -> None:
    s = spec(interval=None, cron="0 3 * * *", timezone="Europe/Paris", jitter=5)
    assert ScheduleSpec.from_body(s.to_body()) == s
    made = plan(s, ScheduleState(cursor=T0 - 86400), T0, set(), never)
    assert ScheduleState.from_body(made.state.to_body()) == made.state


@pytest.mark.parametrize("options", [
    {"interval": None},  # neither
    {"cron": "0 * * * *"},  # both
    {"interval": -5}, {"interval": 0}, {"interval": 1.5}, {"interval": "10"},
    {"interval": True},
    {"interval": None, "cron": "0 25 * * *"},
    {"interval": None, "cron": "0 * * * *", "timezone": "Mars/Olympus"},
    {"timezone": "UTC"},  # an interval takes no time zone
    {"overlap": "queue"}, {"catch_up_window": -1}, {"jitter": -1},
    {"catch_up_window": float("nan")},
])
def test_bad_specs_are_a_schedule_error(options: dict[str, Any]) -> None:
    with pytest.raises(ScheduleError):
        spec(**options)


@pytest.mark.parametrize("name", ["a@b", "", "x" * 151, "with space"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ScheduleError if "@" in name or len(name) == 151 else Exception):
        ScheduleSpec.make(name, "job", interval=10)
