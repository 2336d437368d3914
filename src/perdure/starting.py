"""Start options, kept apart from an agent's own arguments.

``app.start(agent, *args, **kwargs)`` passes every argument to the agent: an agent may
take parameters named ``object_id``, ``deadline``, ``labels``, ``budget`` or anything
else, and receives them. How the object is started goes through a call of its own::

    app.options(object_id="report-1", deadline=3600, labels={"team": "a"}).start(
        report, "q3", deadline="friday")   # the agent's own ``deadline``

``App.options(...)`` returns a ``Starter``: frozen, so one can be kept and used for many
starts (each with the same options). A child object's options work the same way:
``await run.options(object_id="kid").delegate(agent, *args, **kwargs)``.

Objects can be started on a queue the App declared (``App.queue``), which limits how
many of them run at once and how fast they start::

    app.options(queue="emails", key="user-42", priority=3).start(send_digest, "user-42")

A misspelt option is a ``TypeError`` from ``options()`` itself, naming it; a value of the
wrong kind a ``ConfigurationError`` there, and a queue this App did not declare an
``UnknownQueueError``, before anything is stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from perdure.core.flow import Queue, check_priority, check_queue_key
from perdure.core.intent import budget_body
from perdure.core.lifecycle import HELD_BACK_UNTIL
from perdure.core.names import check_labels, check_object_id
from perdure.errors import ConfigurationError, UnknownQueueError

if TYPE_CHECKING:
    from perdure.app import App
    from perdure.handle import Handle

__all__ = ["START_OPTIONS", "Starter"]

START_OPTIONS = ("object_id", "deadline", "max_failures", "labels", "budget", "queue", "key",
                 "priority", "dedupe_key", "start_at", "delay", "debounce_key", "debounce")
"""The names ``App.options`` takes."""


@dataclass(frozen=True, slots=True)
class Starter:
    """Starts objects of ``app`` with these options (``App.options`` makes one).

    ``object_id`` (``None``: a generated id; starting is idempotent on it), ``deadline``
    (seconds from now after which the object is terminated), ``max_failures`` (``None``:
    the node policy's default), ``labels`` (strings by name) and ``budget`` (a
    ``perdure.llm.Budget`` or a mapping of ``tokens`` and ``cost``, as the intent holds
    it: see "Budgets" in docs/howto/model-calls.md).

    ``queue`` (a ``Queue`` the App declared, or its name) is the queue the object is
    claimed through; ``key`` its key there (``per_key`` counts per key), ``priority`` its
    priority (lower first; the queue must be declared with ``priority=True``), and
    ``dedupe_key``: while an object of the queue started with that key has not ended, a
    start with it returns a handle to that object instead (``created=False``).
    ``start_at`` (seconds since the epoch) or ``delay`` (seconds from the start call)
    starts it later: the object is created at once (its id taken) but dormant until then.

    ``debounce_key`` with ``debounce`` (seconds, a quiet period) on a ``queue``: starts
    with the same key collapse into one object, which runs once ``debounce`` seconds
    pass with no newer start, with the latest start's arguments (see "Debounce" in
    docs/howto/queues.md).
    """

    app: App
    object_id: str | None = None
    deadline: float | None = None
    max_failures: int | None = None
    labels: Mapping[str, str] | None = None
    budget: dict[str, Any] | None = None
    queue: Queue | None = None
    key: str | None = None
    priority: int = 0
    dedupe_key: str | None = None
    start_at: float | None = None
    delay: float | None = None
    debounce_key: str | None = None
    debounce: float | None = None

    def begins(self, now: float) -> float | None:
        """When an object started at ``now`` with these options may first run (``None``:
        at once)."""
        if self.debounce is not None:
            return now + self.debounce
        if self.start_at is not None:
            return self.start_at
        return None if self.delay is None else now + self.delay

    def start(self, agent: Callable[..., Any] | str, /, *args: Any, **kwargs: Any) -> Handle:
        """Create an object running ``agent(*args, **kwargs)`` with these options; every
        argument goes to the agent (see ``App.start``)."""
        return self.app._start(agent, args, kwargs, self)


def queue_options(app: App, queue: Queue | str | None, key: Any, priority: Any,
                  dedupe_key: Any) -> tuple[Queue | None, str | None, int, str | None]:
    """The queue options checked: the App's declared queue, the key, the priority and the
    dedupe key (``UnknownQueueError``, ``ConfigurationError``)."""
    if queue is None:
        for name, value in (("key", key), ("priority", priority), ("dedupe_key", dedupe_key)):
            if value is not None:
                raise ConfigurationError(f"{name} is an option of a start on a queue; give "
                                         "queue=... too (declared with app.queue)")
        return None, None, 0, None
    if not isinstance(queue, Queue | str):
        raise ConfigurationError(f"queue is a perdure.Queue or a queue's name, not "
                                 f"{type(queue).__name__}")
    name = queue if isinstance(queue, str) else queue.name
    declared = app.queues.get(name)
    if declared is None:
        known = ", ".join(sorted(app.queues)) or "none"
        raise UnknownQueueError(f"queue {name!r} is not declared on this App (declared: "
                                f"{known}); declare it with app.queue({name!r}, ...)")
    if isinstance(queue, Queue) and not queue.same_limits(declared):
        raise ConfigurationError(f"queue {name!r} is declared on this App with other limits "
                                 f"({declared.limits()}); pass its name or the declared queue")
    return (declared,
            None if key is None else check_queue_key(key, "queue key"),
            0 if priority is None else check_priority(declared, priority),
            None if dedupe_key is None else check_queue_key(dedupe_key, "dedupe key"))


def starter(app: App, *, object_id: str | None, deadline: float | None,
            max_failures: int | None, labels: Mapping[str, str] | None,
            budget: Any, queue: Queue | str | None = None, key: str | None = None,
            priority: int | None = None, dedupe_key: str | None = None,
            start_at: Any = None, delay: Any = None, debounce_key: Any = None,
            debounce: Any = None) -> Starter:
    """A ``Starter`` with checked options (``ConfigurationError`` for a bad value,
    ``UnknownQueueError`` for a queue the App did not declare)."""
    begins, wait = _start_time(start_at, delay)
    quiet = _debounce(queue, debounce_key, debounce, object_id=object_id,
                      dedupe_key=dedupe_key, later=begins is not None or wait is not None)
    if object_id is not None:
        check_object_id(object_id)
    if deadline is not None and (isinstance(deadline, bool)
                                 or not isinstance(deadline, int | float)):
        raise ConfigurationError(f"deadline is a number of seconds from now (or None), not "
                                 f"{deadline!r}")
    if max_failures is not None and (isinstance(max_failures, bool)
                                     or not isinstance(max_failures, int)):
        raise ConfigurationError(f"max_failures is a whole number (or None), not "
                                 f"{max_failures!r}")
    try:
        body = budget_body(budget)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    declared, queue_key, rank, dedupe = queue_options(app, queue, key, priority, dedupe_key)
    return Starter(app, object_id, deadline, max_failures,
                   check_labels(labels) if labels is not None else None, body,
                   declared, queue_key, rank, dedupe, begins, wait,
                   None if quiet is None else check_queue_key(debounce_key, "debounce key"),
                   quiet)


def _debounce(queue: Any, key: Any, period: Any, *, object_id: Any, dedupe_key: Any,
              later: bool) -> float | None:
    """The debounce period in seconds, checked with what it goes with; ``None`` for no
    debounce (``ConfigurationError`` for one half of it, a bad period, or an option that
    contradicts it)."""
    if key is None and period is None:
        return None
    if key is None or period is None:
        raise ConfigurationError("debounce needs both debounce_key=... (what starts collapse "
                                 "by) and debounce=SECONDS (the quiet period)")
    if queue is None:
        raise ConfigurationError("debounce is an option of a start on a queue; give "
                                 "queue=... too (declared with app.queue)")
    if hasattr(period, "total_seconds"):
        period = period.total_seconds()
    if (isinstance(period, bool) or not isinstance(period, int | float)
            or not math.isfinite(period) or period <= 0):
        raise ConfigurationError(f"debounce is a quiet period in seconds, more than 0, not "
                                 f"{period!r}")
    for name, value in (("object_id", object_id), ("dedupe_key", dedupe_key)):
        if value is not None:
            raise ConfigurationError(f"debounce and {name} do not go together: a debounced "
                                     "start finds its object by its debounce key")
    if later:
        raise ConfigurationError("debounce and start_at/delay do not go together: a "
                                 "debounced object starts when its quiet period ends")
    return float(period)


def _start_time(start_at: Any, delay: Any) -> tuple[float | None, float | None]:
    """``start_at`` as seconds since the epoch (from a number or an aware ``datetime``)
    and ``delay`` as seconds; ``ConfigurationError`` for anything else, or both."""
    if start_at is not None and delay is not None:
        raise ConfigurationError("give start_at or delay, not both")
    if delay is not None:
        if hasattr(delay, "total_seconds"):
            delay = delay.total_seconds()
        if (isinstance(delay, bool) or not isinstance(delay, int | float)
                or not math.isfinite(delay) or delay < 0):
            raise ConfigurationError(f"delay is a number of seconds, 0 or more, not {delay!r}")
        return None, float(delay)
    if start_at is None:
        return None, None
    if isinstance(start_at, datetime):
        if start_at.tzinfo is None or start_at.utcoffset() is None:
            raise ConfigurationError(
                "start_at is a datetime with a time zone (datetime.now(UTC), say) or seconds "
                "since the epoch; a naive datetime could mean any zone")
        return start_at.timestamp(), None
    if (isinstance(start_at, bool) or not isinstance(start_at, int | float)
            or not math.isfinite(start_at) or not 0 <= start_at < HELD_BACK_UNTIL):
        raise ConfigurationError(f"start_at is seconds since the epoch (before the year "
                                 f"10000) or an aware datetime, not {start_at!r}")
    return float(start_at), None
