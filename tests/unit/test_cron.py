"""Cron expressions: parsing, bad input, daylight-saving changes, and the next-fire
function against a brute-force walk minute by minute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure.core.cron import Cron
from perdure.errors import ConfigurationError, ScheduleError

PARIS = ZoneInfo("Europe/Paris")


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _fires(expr: str, tz: tzinfo, start: str, end: str) -> list[str]:
    """Every fire in ``(start, end]``, as local times with their offsets."""
    cron, moment, stop = Cron.parse(expr), _at(start), _at(end)
    out: list[str] = []
    while True:
        nxt = cron.next_after(moment, tz)
        assert nxt is not None and nxt > moment
        if nxt > stop:
            return out
        out.append(datetime.fromtimestamp(nxt, tz).isoformat())
        moment = nxt


def test_fields_ranges_steps_lists_and_names() -> None:
    cron = Cron.parse("*/15 9-17/4 1,15 jan-mar,DEC mon-fri")
    assert cron.minutes == {0, 15, 30, 45}
    assert cron.hours == {9, 13, 17}
    assert cron.days == {1, 15}
    assert cron.months == {1, 2, 3, 12}
    assert cron.weekdays == {1, 2, 3, 4, 5}
    assert Cron.parse("0 0 * * 7").weekdays == {0}  # 7 is Sunday too
    assert Cron.parse("5/20 * * * *").minutes == {5, 25, 45}
    assert Cron.parse("@hourly").minutes == {0} and Cron.parse("@daily").hours == {0}


def test_both_day_fields_restricted_match_either() -> None:
    """Vixie cron: day of month 13 OR a Friday, when both are given."""
    fires = _fires("0 12 13 * fri", UTC, "2024-09-01T00:00:00+00:00",
                   "2024-09-30T00:00:00+00:00")
    days = [datetime.fromisoformat(f).day for f in fires]
    assert days == [6, 13, 20, 27]  # Fridays, and the 13th (a Friday as well)


@pytest.mark.parametrize("expr", ["* * *", "* * * * * *", "60 * * * *", "* 24 * * *",
                                  "* * 0 * *", "* * * 13 *", "* * * * 8", "*/0 * * * *",
                                  "5-1 * * * *", "x * * * *", "1,,2 * * * *",
                                  "0 0 30 2 *", "0 0 31 4,6 *", "", "@often"])
def test_bad_expressions_are_a_schedule_error(expr: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Cron.parse(expr)
    assert isinstance(caught.value, ConfigurationError)


def test_spring_forward_a_0230_job_fires_once_at_the_jump() -> None:
    """Paris skips 02:00-03:00 on 2024-03-31: the 02:30 job fires once, at 03:00."""
    fires = _fires("30 2 * * *", PARIS, "2024-03-29T12:00:00+01:00",
                   "2024-04-01T12:00:00+02:00")
    assert fires == ["2024-03-30T02:30:00+01:00", "2024-03-31T03:00:00+02:00",
                     "2024-04-01T02:30:00+02:00"]


def test_fall_back_a_0130_job_fires_once_at_its_first_occurrence() -> None:
    """Paris repeats 02:00-03:00 on 2024-10-27; 01:30 happens once, 02:30 twice: each
    fires once, the first time."""
    assert _fires("30 1 * * *", PARIS, "2024-10-26T12:00:00+02:00",
                  "2024-10-28T12:00:00+01:00") == ["2024-10-27T01:30:00+02:00",
                                                  "2024-10-28T01:30:00+01:00"]
    assert _fires("30 2 * * *", PARIS, "2024-10-26T12:00:00+02:00",
                  "2024-10-27T12:00:00+01:00") == ["2024-10-27T02:30:00+02:00"]


def test_many_fires_in_a_gap_make_one() -> None:
    assert _fires("*/20 2 * * *", PARIS, "2024-03-31T00:00:00+01:00",
                  "2024-03-31T12:00:00+02:00") == ["2024-03-31T03:00:00+02:00"]


def test_a_time_in_the_repeated_hour_finds_the_next_real_fire() -> None:
    """From inside the second 02:xx, the next hourly fire is 03:00, not 02:00 again."""
    after = _at("2024-10-27T02:10:00+01:00")  # the second 02:10
    nxt = Cron.parse("0 * * * *").next_after(after, PARIS)
    assert nxt is not None
    assert datetime.fromtimestamp(nxt, PARIS).isoformat() == "2024-10-27T03:00:00+01:00"


# -- the next fire against a brute-force walk ------------------------------------------

ZONES = [ZoneInfo(name) for name in ("UTC", "Europe/Paris", "America/New_York",
                                     "Australia/Lord_Howe", "Asia/Kathmandu",
                                     "America/Sao_Paulo")]
HORIZON = 3 * 86400  # the walk's reach


def _brute(cron: Cron, tz: ZoneInfo, after: float) -> float | None:
    """The first fire after ``after``, walking UTC minutes: a minute fires when its wall
    time matches at its first occurrence, or when it ends a gap that swallowed a
    matching wall time."""
    minute = (int(after) // 60 + 1) * 60
    for m in range(minute, minute + HORIZON, 60):
        here = datetime.fromtimestamp(m, UTC).astimezone(tz)
        wall = here.replace(tzinfo=None)
        if cron.matches(wall) and here.fold == 0:
            return float(m)
        before = datetime.fromtimestamp(m - 60, UTC).astimezone(tz)
        jump = (here.utcoffset() or timedelta()) - (before.utcoffset() or timedelta())
        if jump > timedelta(0):  # m ends a gap: the walls it skipped
            skipped = before.replace(tzinfo=None) + timedelta(minutes=1)
            while skipped < wall:
                if cron.matches(skipped):
                    return float(m)
                skipped += timedelta(minutes=1)
    return None


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    single = value.map(str)
    span = st.tuples(value, value).map(lambda p: f"{min(p)}-{max(p)}")
    stepped = st.tuples(st.sampled_from(["*", f"{low}"]), st.integers(1, high - low + 1)
                        ).map(lambda p: f"{p[0]}/{p[1]}")
    item = single | span | stepped
    return st.just("*") | st.lists(item, min_size=1, max_size=3).map(",".join)


exprs = st.tuples(_field(0, 59), _field(0, 23), _field(1, 31) | st.just("*"),
                  st.just("*") | _field(1, 12), _field(0, 6) | st.just("*")
                  ).map(" ".join)
# Instants from 2000 to 2037, biased to the days around the changes of the zones above.
changes = st.sampled_from(["2024-03-31T00:30:00+00:00", "2024-10-27T00:10:00+00:00",
                           "2024-03-10T06:50:00+00:00", "2024-11-03T05:30:00+00:00",
                           "2024-04-06T14:45:00+00:00", "2024-10-05T15:20:00+00:00"]
                          ).map(_at)
instants = changes.flatmap(lambda t: st.floats(t - 2 * 86400, t + 86400)) | st.floats(
    _at("2000-01-01T00:00:00+00:00"), _at("2037-01-01T00:00:00+00:00"))


@settings(max_examples=150)
@given(exprs, st.sampled_from(ZONES), instants)
def test_next_fire_is_the_first_fire_a_minute_walk_finds(expr: str, tz: ZoneInfo,
                                                          after: float) -> None:
    try:
        cron = Cron.parse(expr)
    except ScheduleError:
        return  # a day that never comes (Feb 30)
    expected = _brute(cron, tz, after)
    got = cron.next_after(after, tz)
    if expected is None:  # nothing within the walk's reach: nor may it say so
        assert got is None or got >= after + HORIZON - 60
    else:
        assert got == expected


# Around the changes themselves: hours that fall in a gap or a repeated hour somewhere.
dst_exprs = st.tuples(_field(0, 59), st.sampled_from(["*", "2", "1-3", "2,14", "*/2", "0-2",
                                                      "3"]),
                      st.just("*"), st.just("*"), st.just("*")).map(" ".join)
near_changes = changes.flatmap(lambda t: st.floats(t - 4 * 3600, t + 1800))


@settings(max_examples=200)
@given(dst_exprs, st.sampled_from(ZONES[1:]), near_changes)
def test_next_fire_around_a_change_is_what_the_walk_finds(expr: str, tz: ZoneInfo,
                                                           after: float) -> None:
    cron = Cron.parse(expr)
    assert cron.next_after(after, tz) == _brute(cron, tz, after)
