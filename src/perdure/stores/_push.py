"""Pushed notifications inside one process: who listens to a store, and what a commit tells.

A store pushes three kinds of notification (see ``Leases.subscribe`` and
``Leases.subscribe_results``): ``WAKE`` (an object may have become runnable, or its due
time changed: idle nodes claim and work out their sleep again), ``ENDED`` (an object's
terminal record was committed, or it was parked: what ``Handle.result`` waits for) and
``CHANGED`` (records were committed to an object: what a follower waits for). Each
names an object; the empty id means "anything may have changed" (a listener that may
have missed notifications says so, and everyone looks again).

``Hub`` is the subscribers of one store object in this process, by kind and object; a
backend hands it what it learns (its own commits at once, other processes' through its
channel). ``pushes`` is what one group commit tells.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from perdure.core.lifecycle import TERMINAL_STATUSES
from perdure.errors import LeaseLostError
from perdure.stores.base import Append

__all__ = ["CHANGED", "ENDED", "KINDS", "WAKE", "Hub", "pushes"]

log = logging.getLogger("perdure.store")

WAKE = "w"
ENDED = "e"
CHANGED = "c"
KINDS = (CHANGED, ENDED, WAKE)

_TERMINAL = TERMINAL_STATUSES  # str values compare equal to their Status
Callback = Callable[[str], None]


def pushes(ops: Sequence[Append], outcomes: Sequence[BaseException | None] | None,
           kinds: Iterable[str] = KINDS) -> dict[str, list[str]]:
    """What the appends of one commit tell, by kind (only ``kinds``): the objects woken
    (let go with a due time or an awaited event, the target of a signal; ``""`` when
    children were asked to cancel), those that ended or were parked, and those whose
    records changed. ``outcomes``: each append's, as the store returned them (an append
    refused by its fence wrote nothing and tells nothing); ``None`` counts each as
    written (a notification too many only makes a listener look again)."""
    wanted = frozenset(kinds)
    woken: list[str] = []
    ended: list[str] = []
    changed: list[str] = []
    for at, op in enumerate(ops):
        if outcomes is not None and isinstance(outcomes[at], LeaseLostError):
            continue
        if CHANGED in wanted:
            changed.append(op.object_id)
        if op.status in _TERMINAL or op.parked:
            if ENDED in wanted:
                ended.append(op.object_id)
        elif op.release and WAKE in wanted and (
                op.ready_at is not None or op.waiting_event is not None):
            woken.append(op.object_id)
        if WAKE in wanted:
            if op.signal is not None:
                woken.append(op.signal.object_id)
            if op.cancel_children:
                woken.append("")
    found = {WAKE: woken, ENDED: ended, CHANGED: changed}
    return {kind: ids for kind, ids in found.items() if ids}


class Hub:
    """The subscribers of one store object in this process, by kind and object.

    ``changed`` is called (outside the hub's lock, before ``add`` returns) with the kinds
    that have subscribers whenever that set changes, so that a backend's channel can
    listen for exactly those. Callbacks run on the thread that delivers (a commit's, or
    the channel's); they must be quick, and one that fails is logged and skipped.
    """

    def __init__(self, changed: Callable[[frozenset[str]], object] | None = None) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, dict[str | None, list[Callback]]] = {k: {} for k in KINDS}
        self._changed = changed
        self._kinds: frozenset[str] = frozenset()
        self._noting = threading.Lock()  # one change of the kinds at a time, in order

    def kinds(self) -> frozenset[str]:
        """The kinds that have subscribers now."""
        return self._kinds

    def add(self, kinds: Iterable[str], callback: Callback,
            object_id: str | None = None) -> Callable[[], None]:
        """Call ``callback(object_id)`` for each notification of ``kinds`` about
        ``object_id`` (``None``: about any object); returns the function that stops it."""
        kinds = tuple(kinds)
        with self._lock:
            for kind in kinds:
                self._subs[kind].setdefault(object_id, []).append(callback)
        self._note()

        def stop() -> None:
            with self._lock:
                for kind in kinds:
                    found = self._subs[kind].get(object_id)
                    if found is not None and callback in found:
                        found.remove(callback)
                        if not found:
                            del self._subs[kind][object_id]
            self._note()

        return stop

    def _note(self) -> None:
        """Tell ``changed`` the kinds that have subscribers, if they changed."""
        with self._noting:
            with self._lock:
                kinds = frozenset(kind for kind, by_id in self._subs.items() if by_id)
            if kinds != self._kinds:
                self._kinds = kinds
                if self._changed is not None:
                    self._changed(kinds)

    def deliver(self, kind: str, object_ids: Iterable[str]) -> None:
        """Tell the subscribers of ``kind`` about ``object_ids`` (``""``: tell all)."""
        by_id = self._subs[kind]
        if not by_id:
            return
        with self._lock:
            calls: list[tuple[Callback, str]] = []
            for oid in dict.fromkeys(object_ids):
                if oid == "":
                    calls += [(cb, "") for cbs in by_id.values() for cb in cbs]
                    continue
                calls += [(cb, oid) for cb in by_id.get(None, ())]
                calls += [(cb, oid) for cb in by_id.get(oid, ())]
        for callback, oid in calls:
            try:
                callback(oid)
            except Exception:  # the write stands: a subscriber's failure is its own
                log.exception("a push subscriber failed", extra={"action": "wake_failed"})

    def deliver_all(self, found: dict[str, list[str]]) -> None:
        """``deliver`` each kind of ``found``."""
        for kind, ids in found.items():
            self.deliver(kind, ids)

    def everyone(self) -> None:
        """Tell every subscriber of every kind to look again (``""``): notifications
        may have been missed."""
        for kind in KINDS:
            self.deliver(kind, ("",))

    def clear(self) -> None:
        """Forget every subscriber (the store closed)."""
        with self._lock:
            for by_id in self._subs.values():
                by_id.clear()
        self._note()
