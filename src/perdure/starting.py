"""Start options, kept apart from an agent's own arguments.

``app.start(agent, *args, **kwargs)`` passes every argument to the agent: an agent may
take parameters named ``object_id``, ``deadline``, ``labels``, ``budget`` or anything
else, and receives them. How the object is started goes through a call of its own::

    app.options(object_id="report-1", deadline=3600, labels={"team": "a"}).start(
        report, "q3", deadline="friday")   # the agent's own ``deadline``

``App.options(...)`` returns a ``Starter``: frozen, so one can be kept and used for many
starts (each with the same options). A child object's options work the same way:
``await run.options(object_id="kid").delegate(agent, *args, **kwargs)``.

A misspelt option is a ``TypeError`` from ``options()`` itself, naming it; a value of the
wrong kind a ``ConfigurationError`` there, before anything is stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from perdure.core.intent import budget_body
from perdure.core.names import check_labels, check_object_id
from perdure.errors import ConfigurationError

if TYPE_CHECKING:
    from perdure.app import App
    from perdure.handle import Handle

__all__ = ["START_OPTIONS", "Starter"]

START_OPTIONS = ("object_id", "deadline", "max_failures", "labels", "budget", "start_at",
                 "delay")
"""The names ``App.options`` takes."""


@dataclass(frozen=True, slots=True)
class Starter:
    """Starts objects of ``app`` with these options (``App.options`` makes one).

    ``object_id`` (``None``: a generated id; starting is idempotent on it), ``deadline``
    (seconds from now after which the object is terminated), ``max_failures`` (``None``:
    the node policy's default), ``labels`` (strings by name) and ``budget`` (a
    ``perdure.llm.Budget`` or a mapping of ``tokens`` and ``cost``, as the intent holds
    it: see "Budgets" in docs/howto/model-calls.md). ``start_at`` (seconds since the
    epoch) or ``delay`` (seconds from the start call) starts it later: the object is
    created at once (its id taken) but dormant until then.
    """

    app: App
    object_id: str | None = None
    deadline: float | None = None
    max_failures: int | None = None
    labels: Mapping[str, str] | None = None
    budget: dict[str, Any] | None = None
    start_at: float | None = None
    delay: float | None = None

    def begins(self, now: float) -> float | None:
        """When an object started at ``now`` with these options may first run (``None``:
        at once)."""
        if self.start_at is not None:
            return self.start_at
        return None if self.delay is None else now + self.delay

    def start(self, agent: Callable[..., Any] | str, /, *args: Any, **kwargs: Any) -> Handle:
        """Create an object running ``agent(*args, **kwargs)`` with these options; every
        argument goes to the agent (see ``App.start``)."""
        return self.app._start(agent, args, kwargs, self)


def starter(app: App, *, object_id: str | None, deadline: float | None,
            max_failures: int | None, labels: Mapping[str, str] | None,
            budget: Any, start_at: Any = None, delay: Any = None) -> Starter:
    """A ``Starter`` with checked options (``ConfigurationError`` for a bad value)."""
    begins, wait = _start_time(start_at, delay)
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
    return Starter(app, object_id, deadline, max_failures,
                   check_labels(labels) if labels is not None else None, body, begins, wait)


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
            or not math.isfinite(start_at) or start_at < 0):
        raise ConfigurationError(f"start_at is seconds since the epoch or an aware datetime, "
                                 f"not {start_at!r}")
    return float(start_at), None
