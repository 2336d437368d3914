"""Cron expressions and their fire times in a time zone: pure, no I/O.

``Cron.parse("30 2 * * mon-fri")`` reads the five classic fields (minute, hour, day of
month, month, day of week) with ``*``, ranges ``a-b``, steps ``*/s`` ``a-b/s`` ``a/s``,
lists ``a,b`` and the English names of months (``jan``) and days (``sun``; 0 and 7 are
both Sunday), or one of the shorthands ``@hourly``, ``@daily`` (``@midnight``),
``@weekly``, ``@monthly``, ``@yearly`` (``@annually``). As in Vixie cron, when both day
fields are restricted (neither starts with ``*``) a day matches either of them.

``Cron.next_after(after, tz)`` is the first fire strictly after the instant ``after``
(seconds since the epoch), the expression read as wall-clock time in ``tz``. Around a
daylight-saving change every wall-clock time fires once:

- a time that does not exist (the clocks jump from 02:00 to 03:00) fires at the jump
  itself, the first instant after the gap (03:00 the new time), once however many
  matching times the gap swallowed;
- a time that occurs twice (the clocks go back from 03:00 to 02:00) fires at its first
  occurrence only.

A job that must run every real hour through the change is better written in UTC or as
an interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

from perdure.errors import ScheduleError

__all__ = ["Cron", "fire_instant", "instant_of_wall"]

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_SHORTHANDS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# (name, lowest, highest, names for lowest.., or empty)
_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
SEARCH_YEARS = 30  # a fire further away than this counts as never (Feb 29 on a Monday: 28)


def _value(text: str, field: str, low: int, high: int, names: tuple[str, ...],
           expr: str) -> int:
    lowered = text.lower()
    if names and lowered in names:
        return names.index(lowered) + low
    if not text.isdigit():
        raise ScheduleError(f"cron {expr!r}: {text!r} is not a number or name for the {field}")
    number = int(text)
    if not low <= number <= high:
        raise ScheduleError(f"cron {expr!r}: {number} is out of range for the {field} "
                            f"({low}-{high})")
    return number


def _field(text: str, index: int, expr: str) -> tuple[frozenset[int], bool]:
    """The values a field allows, and whether it is unrestricted (starts with ``*``)."""
    field, low, high, names = _FIELDS[index]
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise ScheduleError(f"cron {expr!r}: an empty item in the {field} field")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ScheduleError(f"cron {expr!r}: step {step_text!r} of the {field} must "
                                    "be a whole number above 0")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start = _value(first, field, low, high, names, expr)
            end = _value(last, field, low, high, names, expr)
            if end < start:
                raise ScheduleError(f"cron {expr!r}: range {base!r} of the {field} runs "
                                    "backwards")
        else:
            start = _value(base, field, low, high, names, expr)
            end = high if slash else start
        values.update(range(start, end + 1, step))
    if index == 4 and 7 in values:  # 7 is Sunday too
        values.discard(7)
        values.add(0)
    return frozenset(values), text.startswith("*")


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed cron expression (``Cron.parse``); ``text`` is what was given."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday
    any_day: bool  # day of month unrestricted
    any_weekday: bool  # day of week unrestricted

    @classmethod
    def parse(cls, expr: str) -> Cron:
        """Read ``expr``; ``ScheduleError`` naming what is wrong, or if it never fires."""
        if not isinstance(expr, str):
            raise ScheduleError(f"a cron expression is a string, not {type(expr).__name__}")
        text = _SHORTHANDS.get(expr.strip().lower(), expr)
        parts = text.split()
        if len(parts) != 5:
            raise ScheduleError(f"cron {expr!r} has {len(parts)} fields; it needs five "
                                "(minute hour day-of-month month day-of-week) or a "
                                "shorthand such as @daily")
        fields = [_field(part, i, expr) for i, part in enumerate(parts)]
        cron = cls(expr, fields[0][0], fields[1][0], fields[2][0], fields[3][0],
                   fields[4][0], fields[2][1], fields[4][1])
        if cron.next_wall(datetime(2000, 1, 1)) is None:
            raise ScheduleError(f"cron {expr!r} never fires (no such day)")
        return cron

    def day_matches(self, day: datetime) -> bool:
        """Whether the calendar day of ``day`` is one the expression runs on."""
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return in_week
        if self.any_weekday:
            return in_month
        return in_month or in_week

    def matches(self, wall: datetime) -> bool:
        """Whether the wall-clock minute ``wall`` (naive) is a fire time."""
        return (wall.minute in self.minutes and wall.hour in self.hours
                and self.day_matches(wall))

    def next_wall(self, start: datetime) -> datetime | None:
        """The first matching wall-clock minute at or after ``start`` (naive, seconds
        dropped), or ``None`` within ``SEARCH_YEARS``."""
        wall = start.replace(second=0, microsecond=0)
        limit = wall.year + SEARCH_YEARS
        while wall.year <= limit:
            if wall.month not in self.months:
                year, month = (wall.year + 1, 1) if wall.month == 12 else (wall.year,
                                                                           wall.month + 1)
                wall = datetime(year, month, 1)
                continue
            if not self.day_matches(wall):
                wall = datetime(wall.year, wall.month, wall.day) + timedelta(days=1)
                continue
            if wall.hour not in self.hours:
                later = [h for h in self.hours if h > wall.hour]
                wall = (wall.replace(hour=min(later), minute=0) if later else
                        datetime(wall.year, wall.month, wall.day) + timedelta(days=1))
                continue
            if wall.minute not in self.minutes:
                later = [m for m in self.minutes if m > wall.minute]
                wall = (wall.replace(minute=min(later)) if later else
                        wall.replace(minute=0) + timedelta(hours=1))
                continue
            return wall
        return None

    def next_after(self, after: float, tz: tzinfo) -> float | None:
        """The first fire strictly after ``after`` (see the module's DST rules), or
        ``None`` if there is none within ``SEARCH_YEARS``."""
        wall: datetime | None = (datetime.fromtimestamp(after, UTC).astimezone(tz)
                                 .replace(tzinfo=None, fold=0))
        while wall is not None:
            wall = self.next_wall(wall)
            if wall is None:
                return None
            instant = fire_instant(wall, tz)
            if instant > after:
                return instant
            wall += timedelta(minutes=1)
        return None


def instant_of_wall(wall: datetime, tz: tzinfo) -> tuple[float, bool]:
    """The instant of the naive wall-clock time ``wall`` in ``tz`` (its first occurrence
    when it occurs twice), and whether it exists (``False``: it falls in a gap, and the
    instant is then the end of the gap)."""
    first = wall.replace(tzinfo=tz, fold=0)
    instant = first.astimezone(UTC)
    if instant.astimezone(tz).replace(tzinfo=None) == wall:
        return instant.timestamp(), True
    # In a gap: fold=0 read it with the offset from before the change, fold=1 with the
    # one after; the change lies between the two readings.
    low = wall.replace(tzinfo=tz, fold=1).astimezone(UTC).timestamp()
    high = instant.timestamp()
    low, high = min(low, high), max(low, high)
    return _change_between(low, high, lambda t: datetime.fromtimestamp(t, tz).utcoffset()
                           ), False


def _change_between(low: float, high: float,
                    offset: Callable[[float], timedelta | None]) -> float:
    """The first whole second in ``(low, high]`` whose offset is ``offset(high)``."""
    target = offset(high)
    lo, hi = int(low), int(high)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offset(mid) == target:
            hi = mid
        else:
            lo = mid
    return float(hi)


def fire_instant(wall: datetime, tz: tzinfo) -> float:
    """When the matching wall-clock time ``wall`` fires (``instant_of_wall``)."""
    return instant_of_wall(wall, tz)[0]
