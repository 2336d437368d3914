"""``run.on_update``: a request sent into a running object, applied and replied to once.

A caller's ``App.update`` validates the request (the validator declared with
``App.define_update`` is pure: it sees only the arguments), then sends it as the
reserved event ``perdure:update`` (``{"id", "name", "args"}``). The object takes
updates while it waits in ``run.wait_for``: the wait takes its position, then each
update takes the next ones, in the order they came.

The execution rule: an update found in the inbox (its seal vouched for) is received at
a position of its own (a ``wait`` for ``perdure:update``; its receipt consumes the
event with the next commit, so the first step of the handler commits the acceptance
before its body runs); the validator is asked again, the handler the agent set with
``run.on_update`` runs as agent code (its steps are recorded like any other), and its
reply is emitted as the event ``perdure:update`` (``{"id", "name", "ok", "result"}``,
or ``"refused"``/``"error"`` with the reason), committed at once.

The replay rule: a recorded update receipt at the position after a wait is taken again
and its handler runs again as code, its steps replayed from memory (nothing they did
is done twice), and the recorded reply is not emitted again. A worker killed after the
acceptance and before the reply resumes in the handler and replies once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perdure.core.bodies import EventReceived
from perdure.core.codec import decode, detached, encode
from perdure.core.events import UPDATE_EVENT
from perdure.core.names import check_name
from perdure.core.records import Kind
from perdure.engine.commands.positions import branch, find
from perdure.engine.commands.waits import _inbox, vouched
from perdure.errors import ConfigurationError
from perdure.stores.base import Event

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["on_update", "take_updates"]


def on_update(self: Run, name: str, handler: Callable[..., Any], *,
              validator: Callable[..., Any] | None = None) -> None:
    """Take update ``name`` while this agent waits in ``run.wait_for``: ``handler(*args)``
    (a function or a coroutine function, agent code: it may change the agent's state
    and call ``run.step``) gives the reply the caller of ``App.update`` receives.
    ``validator(*args)`` (pure; raise to refuse) runs before the handler, after the
    validator ``App.define_update`` declared (which callers run first)."""
    check_name(name, "update name")
    if not callable(handler) or (validator is not None and not callable(validator)):
        raise ConfigurationError(f"run.on_update({name!r}, handler, validator=...): the "
                                 "handler and the validator are functions")
    self._update_handlers[name] = (handler, validator)


async def take_updates(self: Run, *, live: bool) -> None:
    """Replay the updates memory holds at the next positions; then, when ``live`` and
    memory holds nothing further, take those waiting in the inbox."""
    # A wait in a gathered branch applies no update (the main line's waits do): it
    # refuses one that arrived, with a reply, so that a caller hears why and the object
    # is not woken for it again.
    refuse = self._branched and branch.get() is not None
    while True:
        recs = self._recorded(self._pos) if self._pos <= self._max_recorded else ()
        if recs:
            first = recs[0].body
            if first.get("cmd") != "wait" or first.get("name") != UPDATE_EVENT:
                return
            pos, recs = self._take("wait", UPDATE_EVENT)
            got = find(recs, Kind.EVENT_RECEIVED)
            if got is None:
                return
            await _apply(self, self._opened(detached(got.body.get("payload"))), refuse=refuse)
            continue
        if not live or self._pos <= self._max_recorded:
            return
        found = await _next_request(self)
        if found is None:
            return
        ev, digest = found
        self._boundary()
        pos, _ = self._take("wait", UPDATE_EVENT)
        try:
            payload = decode(ev.payload)
        except ValueError:
            payload = {"undecodable_payload": ev.payload.decode("utf-8", "replace")}
        self._journal.defer(EventReceived(pos, UPDATE_EVENT, ev.event_id, payload,
                                          digest).draft(),
                            consume_event_ids=[ev.event_id])
        await _apply(self, self._opened(payload), refuse=refuse)


async def _next_request(run: Run) -> tuple[Event, str] | None:
    """The first update request of the inbox that its seal vouches for."""
    for ev in await _inbox(run, UPDATE_EVENT):
        if ev.name == UPDATE_EVENT and ev.event_id not in run._consumed:
            run._consumed.add(ev.event_id)
            digest = vouched(run, ev)
            if digest is not None:
                return ev, digest
    return None


async def _apply(run: Run, request: Any, *, refuse: bool = False) -> None:
    """Validate and run one update request; emit its reply (once: a replay finds it).
    ``refuse``: the wait takes no updates (a gathered branch's): the reply says so."""
    request = request if isinstance(request, dict) else {}
    uid, name, args = request.get("id"), request.get("name"), request.get("args")
    reply: dict[str, Any] = {"id": uid, "name": name, "ok": False}
    entry = run._update_handlers.get(name) if isinstance(name, str) else None
    if refuse:
        reply["refused"] = (f"this object takes no update {name!r} now: it waits inside "
                            "run.gather, and only a run.wait_for outside one takes updates")
    elif entry is None or not isinstance(args, list):
        reply["refused"] = (f"this object takes no update {name!r} now (no run.on_update "
                            "for it before this wait)")
    else:
        handler, validator = entry
        declared = run._update_validators.get(name)
        try:
            for check in (declared, validator):
                if check is not None:
                    check(*args)
        except Exception as exc:  # noqa: BLE001 - a validator refuses by raising anything
            reply["refused"] = f"{type(exc).__name__}: {exc}"
        else:
            try:
                result = handler(*args)
                if inspect.isawaitable(result):
                    result = await result
                encode(result, what=f"reply of update {name!r}")
            except Exception as exc:  # noqa: BLE001 - the handler failed: the reply says so
                reply["error"] = f"{type(exc).__name__}: {exc}"
            else:
                reply.update(ok=True, result=result)
    await run.emit(UPDATE_EVENT, reply)
