"""Flow control: named queues and the limits a claim respects. Pure rules, no I/O.

A queue is a name with limits. An object started on a queue (``App.options(queue=...)``)
is claimed only while the queue has room for it:

- ``concurrency``: at most this many of the queue's objects held at once, over every node;
- ``per_key``: at most this many held at once per key (``options(key=...)``: a user, a
  tenant, a repository ...); objects started without a key count only against the
  queue's other limits;
- ``worker_concurrency``: at most this many held at once by one worker process;
- ``limiter`` (``limit`` per ``period`` seconds): at most ``limit`` of the queue's objects
  *start* (are claimed for the first time) within any ``period``; an object that already
  started is never held back by it when it resumes;
- ``priority``: whether starts may give a priority (a whole number, lower first; objects
  started without one come first, as priority 0).

A **slot** is an object of the queue held under a live lease: claimed by a worker whose
lease has not lapsed. A dormant object (sleeping, waiting for an event or a person) is
let go by its node, so it holds no slot; a killed worker's slots free themselves when
its leases lapse. Nothing is counted up and down, so nothing can leak.

The store counts the slots inside the claim itself, serialised per queue, and asks
``admit`` which of the runnable candidates (in the queue's order) it may take. An object
asked to cancel is taken whatever the limits: it only writes its end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perdure.core.names import check_name
from perdure.errors import ConfigurationError

__all__ = [
    "MAX_PRIORITY",
    "Candidate",
    "Queue",
    "QueueLoad",
    "admit",
    "check_priority",
    "check_queue_key",
    "room",
]

MAX_PRIORITY = 2**31 - 1
"""The largest priority a start may give (priorities are stored as 32-bit integers)."""


def _count(value: Any, what: str) -> int | None:
    """A limit: ``None`` (no limit) or a whole number of at least 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{what} is a whole number of at least 1 (or None: no "
                                 f"limit), not {value!r}")
    if value < 1:
        raise ConfigurationError(f"{what} must be at least 1 (or None: no limit), not "
                                 f"{value}; to stop a queue, pause its objects or stop "
                                 "starting them")
    if value > MAX_PRIORITY:
        raise ConfigurationError(f"{what} must be at most {MAX_PRIORITY}, not {value}")
    return value


@dataclass(frozen=True, slots=True)
class Queue:
    """A named queue and its limits (see the module): ``Queue("emails", concurrency=5)``.

    ``limiter`` is ``{"limit": N, "period": SECONDS}`` (at most N starts per period); the
    dataclass keeps it as ``rate_limit`` and ``rate_period``. A limit that makes no sense
    (zero, negative, not a whole number) is a ``ConfigurationError`` here.
    """

    name: str
    concurrency: int | None = None
    per_key: int | None = None
    worker_concurrency: int | None = None
    limiter: Mapping[str, float] | None = field(default=None, compare=False, repr=False)
    priority: bool = False
    rate_limit: int | None = None
    rate_period: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigurationError(f"a queue name is a string, not {self.name!r}")
        check_name(self.name, "queue name")
        for what in ("concurrency", "per_key", "worker_concurrency"):
            _count(getattr(self, what), what)
        if not isinstance(self.priority, bool):
            raise ConfigurationError(f"priority is True or False (whether starts may give a "
                                     f"priority), not {self.priority!r}")
        limit, period = self.rate_limit, self.rate_period
        if self.limiter is not None:
            if limit is not None or period is not None:
                raise ConfigurationError("give limiter={'limit': N, 'period': S} or "
                                         "rate_limit and rate_period, not both")
            if not isinstance(self.limiter, Mapping) or set(self.limiter) != {"limit",
                                                                              "period"}:
                raise ConfigurationError(f"limiter is {{'limit': N, 'period': SECONDS}}, not "
                                         f"{self.limiter!r}")
            limit, period = self.limiter["limit"], self.limiter["period"]  # type: ignore[assignment]
        if (limit is None) != (period is None):
            raise ConfigurationError("a rate limit needs both a limit and a period")
        if limit is not None:
            _count(limit, "the limiter's limit")
            if (isinstance(period, bool) or not isinstance(period, int | float)
                    or not math.isfinite(period) or period <= 0):
                raise ConfigurationError(f"the limiter's period is a positive number of "
                                         f"seconds, not {period!r}")
            object.__setattr__(self, "rate_period", float(period))
        object.__setattr__(self, "rate_limit", limit)
        object.__setattr__(self, "limiter", None)

    def limits(self) -> dict[str, Any]:
        """The limits as plain values (what ``perdure queues --json`` shows)."""
        return {"concurrency": self.concurrency, "per_key": self.per_key,
                "worker_concurrency": self.worker_concurrency,
                "limiter": (None if self.rate_limit is None
                            else {"limit": self.rate_limit, "period": self.rate_period}),
                "priority": self.priority}

    def same_limits(self, other: Queue) -> bool:
        """Whether ``other`` has this queue's name and limits."""
        return self.name == other.name and self.limits() == other.limits()


def check_queue_key(key: Any, what: str = "queue key") -> str:
    """A key (``options(key=...)``, ``dedupe_key``): a name (``perdure.core.names``)."""
    if not isinstance(key, str):
        raise ConfigurationError(f"a {what} is a string, not {type(key).__name__}")
    return check_name(key, what)


DEBOUNCE_MARK = "\x1fdebounce\x1f"
"""What a debounce key is stored under (in the dedupe key's column): no dedupe key, a
name, holds a control character, so the two never meet."""


def debounce_column(key: str) -> str:
    """The stored form of the debounce key ``key`` (``DEBOUNCE_MARK`` + ``key``)."""
    return DEBOUNCE_MARK + key


def check_priority(queue: Queue, priority: Any) -> int:
    """A start's priority on ``queue``: a whole number from 0 to ``MAX_PRIORITY`` (lower
    first), on a queue declared with ``priority=True``."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigurationError(f"priority is a whole number (lower runs first), not "
                                 f"{priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise ConfigurationError(f"priority must be from 0 to {MAX_PRIORITY}, not {priority}")
    if not queue.priority:
        raise ConfigurationError(f"queue {queue.name!r} was not declared with priority=True; "
                                 "declare it so to start objects on it with a priority")
    return priority


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """What a queue holds at the moment of a claim: ``held`` slots (live leases) over every
    node, ``mine`` of them held by the claiming worker, ``by_key`` held per key, and
    ``started``: objects that started within the limiter's period."""

    held: int = 0
    mine: int = 0
    by_key: Mapping[str, int] = field(default_factory=dict)
    started: int = 0


@dataclass(frozen=True, slots=True)
class Candidate:
    """A runnable object of the queue, in the queue's order: its key, whether it never
    started (``fresh``: the limiter counts it), and whether it is asked to cancel."""

    object_id: str
    key: str | None = None
    fresh: bool = False
    cancel: bool = False


_NO_LIMIT = 1 << 62


@dataclass(frozen=True, slots=True)
class Room:
    """How much a claim may take of a queue before looking at keys: ``slots`` in all
    (the claim's own limit included), whether objects that never started may start
    (``fresh``), ``full_keys`` (keys at their ``per_key`` cap: skip their objects), and
    ``fresh_slots``: how many may start."""

    slots: int
    fresh: bool
    fresh_slots: int
    full_keys: tuple[str, ...]


def room(queue: Queue, load: QueueLoad, limit: int) -> Room:
    """The room ``queue`` has for one worker's claim of up to ``limit`` objects."""
    slots = limit
    if queue.concurrency is not None:
        slots = min(slots, queue.concurrency - load.held)
    if queue.worker_concurrency is not None:
        slots = min(slots, queue.worker_concurrency - load.mine)
    fresh_slots = _NO_LIMIT if queue.rate_limit is None else queue.rate_limit - load.started
    full = tuple(sorted(key for key, n in load.by_key.items()
                        if queue.per_key is not None and n >= queue.per_key))
    return Room(max(0, slots), fresh_slots > 0, max(0, fresh_slots), full)


def admit(queue: Queue, load: QueueLoad, candidates: Sequence[Candidate], limit: int
          ) -> list[str]:
    """Which of ``candidates`` (runnable, in the queue's order) one claim of up to
    ``limit`` objects takes, so that no limit of ``queue`` is exceeded once they are held.
    Objects asked to cancel are taken first, whatever the limits (within ``limit``)."""
    have = room(queue, load, limit)
    slots, fresh = have.slots, have.fresh_slots
    taken: dict[str, int] = {}
    chosen: list[str] = []
    for candidate in candidates:
        if len(chosen) >= limit:
            break
        if candidate.cancel:
            chosen.append(candidate.object_id)
            continue
        if slots <= 0:
            continue  # only cancels can still be taken
        if candidate.fresh and fresh <= 0:
            continue
        key = candidate.key
        if key is not None and queue.per_key is not None:
            if load.by_key.get(key, 0) + taken.get(key, 0) >= queue.per_key:
                continue
            taken[key] = taken.get(key, 0) + 1
        chosen.append(candidate.object_id)
        slots -= 1
        if candidate.fresh:
            fresh -= 1
    return chosen
