"""Hooks: one typed seam where metrics, traces, logs and a live view attach to a node.

A node tells its :class:`Hooks` what happens to the objects it runs, as small frozen
events: a claim round, an object claimed, a step recorded, dormancy, a wake-up, an end,
a commit batch, a lost lease, an integrity failure, the event loop's lag. Each carries
what a listener needs (ids, durations in seconds) and nothing it would have to ask the
store for.

Listening costs nothing when nobody listens: the engine checks :attr:`Hooks.active`
before it builds an event, so a node without listeners allocates nothing on its hot
path. A listener is a plain callable taking one event; it runs on the node's event
loop, so it must be quick (hand slow work to a queue or a thread). A listener that
raises is logged once per type of error and never breaks the node.

    >>> app = perdure.App()
    >>> seen = []
    >>> stop = app.hooks.subscribe(seen.append)               # every event
    >>> stop2 = app.hooks.subscribe(print, StepRecorded)      # only steps

:class:`Counters` is the first listener: the counts a node keeps (commits, appends,
steps, objects completed, held-records hits) are kept by it, and tests and benches read
them there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from perdure.core.records import Record

__all__ = [
    "ClaimRound",
    "CommitBatch",
    "Counters",
    "HookEvent",
    "Hooks",
    "IntegrityFailure",
    "LeaseLost",
    "LoopLag",
    "ObjectClaimed",
    "ObjectDormant",
    "ObjectTerminated",
    "ObjectWoke",
    "RecordsWritten",
    "StepRecorded",
]

log = logging.getLogger("perdure.hooks")

E = TypeVar("E", bound="HookEvent")


@dataclass(frozen=True, slots=True)
class HookEvent:
    """What every event carries: the node that saw it."""

    node_id: str


@dataclass(frozen=True, slots=True)
class ClaimRound(HookEvent):
    """The node asked the store for objects to run (it does when it has a free slot and
    is woken, or its idle wait ends): ``claimed`` the ids it was given (empty: none was
    runnable for it), ``failed`` True when the store did not answer.

    A round that began after some change saw that change: waiting for two rounds more
    than were counted at a moment is how to know the node has looked at the store since
    (and, say, left a paused object alone)."""

    claimed: tuple[str, ...]
    failed: bool


@dataclass(frozen=True, slots=True)
class ObjectClaimed(HookEvent):
    """The node claimed an object and checked its memory, before any agent code ran.

    ``records`` is how many records it read from the store this time (0 when it held
    them all); ``seconds`` the time from the claim to the checked memory; ``trace_id``
    the one the object's records carry."""

    object_id: str
    epoch: int
    records: int
    held: bool
    seconds: float
    trace_id: str = ""


@dataclass(frozen=True, slots=True)
class StepRecorded(HookEvent):
    """A step ran and its outcome was handed to the journal (``ok`` False: it raised).

    ``seconds`` is how long the step's body ran."""

    object_id: str
    step: str
    position: str
    ok: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class ObjectDormant(HookEvent):
    """The object let go of its lease to wait: ``reason`` says for what (``sleep``,
    ``event``, ``retry``, ``children``, ``gather`` from the agent; a ``ReasonCode``
    such as ``paused`` or ``parked`` from the evaluation cycle), ``ready_at`` when it
    is due (None: on an event or a person)."""

    object_id: str
    reason: str
    ready_at: float | None


@dataclass(frozen=True, slots=True)
class ObjectWoke(HookEvent):
    """A dormant object runs again: ``reason`` what it waited for (sleep, event, retry,
    children, gather); ``late`` the seconds from its due time to the moment its agent
    runs again (its wake latency; None when it had no due time, as for an event)."""

    object_id: str
    reason: str
    late: float | None


@dataclass(frozen=True, slots=True)
class ObjectTerminated(HookEvent):
    """The object's terminal record was written: ``status`` completed, failed or
    cancelled; ``seconds`` the run's last claim to its end."""

    object_id: str
    status: str
    seconds: float


@dataclass(frozen=True, slots=True)
class CommitBatch(HookEvent):
    """One commit of the node's group committer: how many appends and records it carried,
    how many were refused, and how long the store took."""

    appends: int
    records: int
    refused: int
    seconds: float


@dataclass(frozen=True, slots=True)
class RecordsWritten(HookEvent):
    """Records the node's group committer just made durable (the appends the store
    refused left out), in commit order: what an exporter reads model calls, tokens,
    retries, in-doubt steps and spans from. Only records written now are here: a step
    replayed from memory writes none, so a listener sees each record once, from the
    node that wrote it. Built only when a listener subscribed to this type."""

    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class LeaseLost(HookEvent):
    """The node learnt that it no longer holds the object (another node took it)."""

    object_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class LoopLag(HookEvent):
    """How late the node's event loop ran a timer due ``interval`` seconds after the
    last one: ``seconds`` (0 when on time) is time the loop spent on something else or
    waiting for a CPU, which every object on the node waited too. Sent every
    ``interval`` while anyone listens; ``worst`` is the worst lag since the node
    started."""

    seconds: float
    worst: float
    interval: float


@dataclass(frozen=True, slots=True)
class IntegrityFailure(HookEvent):
    """Memory did not verify: the object was parked without running agent code."""

    object_id: str
    seq: int
    reason: str


Listener = Callable[[Any], None]


class Hooks:
    """Listeners of a node's events. Thread-safe to subscribe from any thread."""

    __slots__ = ("_all", "_by_type", "_failed", "_lock", "active")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all: tuple[Listener, ...] = ()
        self._by_type: dict[type[HookEvent], tuple[Listener, ...]] = {}
        self._failed: set[tuple[int, type[BaseException]]] = set()
        #: Whether anyone listens: the engine builds no event while this is False.
        self.active = False

    def listens(self, kind: type[HookEvent]) -> bool:
        """Whether anyone would receive an event of ``kind`` (a subscriber to every
        event, or to this type): for events costly enough to build only on demand."""
        return bool(self._all) or kind in self._by_type

    def subscribe(self, listener: Callable[[E], None],
                  *types: type[E]) -> Callable[[], None]:
        """Call ``listener(event)`` for every event (or only for events of ``types``).

        Returns a function that unsubscribes it.
        """
        with self._lock:
            if types:
                for kind in types:
                    self._by_type[kind] = (*self._by_type.get(kind, ()), listener)
            else:
                self._all = (*self._all, listener)
            self.active = True

        def unsubscribe() -> None:
            with self._lock:
                if types:
                    for kind in types:
                        rest = tuple(x for x in self._by_type.get(kind, ()) if x is not listener)
                        if rest:
                            self._by_type[kind] = rest
                        else:
                            self._by_type.pop(kind, None)
                else:
                    self._all = tuple(x for x in self._all if x is not listener)
                self.active = bool(self._all or self._by_type)

        return unsubscribe

    def emit(self, event: HookEvent) -> None:
        """Hand ``event`` to its listeners, in the order they subscribed; a listener that
        raises is logged (once per listener and error type) and the others still run."""
        for listener in (*self._all, *self._by_type.get(type(event), ())):
            try:
                listener(event)
            except Exception as exc:  # noqa: BLE001 - a listener never breaks the node
                key = (id(listener), type(exc))
                if key not in self._failed:
                    self._failed.add(key)
                    log.warning("a hook listener failed: %s: %s", type(exc).__name__, exc,
                                extra={"action": "hook_failed",
                                       "event": type(event).__name__})


class Counters:
    """The counts a node keeps, as a listener of its :class:`Hooks`.

    ``commits``/``appends``/``records`` count the group committer's batches; ``steps``
    steps recorded; ``completed`` objects that reached their terminal record (any
    status); ``claims`` and ``held_claims`` claims, and those served from held records;
    ``dormant``, ``lease_lost`` and ``integrity_failures`` as named; ``worst_loop_lag``
    the worst event-loop lag reported (seconds).
    """

    def __init__(self) -> None:
        self.commits = 0
        self.appends = 0
        self.records = 0
        self.refused = 0
        self.steps = 0
        self.completed = 0
        self.claims = 0
        self.held_claims = 0
        self.dormant = 0
        self.lease_lost = 0
        self.integrity_failures = 0
        self.worst_loop_lag = 0.0

    def attach(self, hooks: Hooks, *types: type[HookEvent]) -> Callable[[], None]:
        """Subscribe to ``hooks`` (to every event, or only to ``types``: a bench counting
        ends and commits need not be told of every step); returns the function that
        detaches."""
        return hooks.subscribe(self, *types)

    def __call__(self, event: HookEvent) -> None:
        """Count ``event``."""
        match event:
            case CommitBatch():
                self.commits += 1
                self.appends += event.appends
                self.records += event.records
                self.refused += event.refused
            case StepRecorded():
                self.steps += 1
            case ObjectTerminated():
                self.completed += 1
            case ObjectClaimed():
                self.claims += 1
                self.held_claims += event.held
            case ObjectDormant():
                self.dormant += 1
            case LeaseLost():
                self.lease_lost += 1
            case IntegrityFailure():
                self.integrity_failures += 1
            case LoopLag():
                self.worst_loop_lag = max(self.worst_loop_lag, event.seconds)
            case _:
                pass
