"""``run.sleep`` and ``run.wait_for``: the object goes dormant until a time or an event.

The replay rule: a ``woke`` record ends a sleep, an ``event_received`` record gives
a wait its payload and a ``wait_timed_out`` record gives it ``None``; a ``dormant``
record alone means the object went dormant here before, and its ``wake_at`` still
holds (it is never moved by a replay).

The execution rule: a sleep (or a wait whose timeout passed) that is due records its
wake-up with the next commit and returns; one that is not yet due unwinds the agent
with ``Suspend`` (and the ``dormant`` record the first time). A wait takes the first
matching event from the inbox that its seal vouches for and memory has not received
before; a refused event is recorded as such and consumed, so it never comes back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from perdure.core.bodies import (
    Dormant,
    EventReceived,
    EventRefused,
    WaitTimedOut,
    Woke,
)
from perdure.core.codec import MAX_DEPTH, decode, detached, encode
from perdure.core.events import UPDATE_EVENT
from perdure.core.names import check_name
from perdure.core.questions import asking_note
from perdure.core.records import Kind, RecordDraft
from perdure.core.sealing import marked
from perdure.engine.commands.positions import find
from perdure.engine.signals import Suspend
from perdure.errors import ConfigurationError
from perdure.stores.base import Event

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["check_question", "received", "sleep", "vouched", "wait_for", "watch_wait"]

_EVENT_RECEIVED = Kind.EVENT_RECEIVED.value  # compared as the plain string a record holds


async def sleep(self: Run, seconds: float) -> None:
    """Go dormant for ``seconds``; the node lets the object go until the timer is due."""
    if hasattr(seconds, "total_seconds"):
        seconds = seconds.total_seconds()
    pos, recs = self._take("sleep", None)
    if find(recs, Kind.WOKE) is not None:
        return
    dormant = find(recs, Kind.DORMANT)
    now = self._clock()
    if dormant is not None:
        wake_at = float(dormant.body["wake_at"])
        if now >= wake_at:
            self._journal.defer(Woke(pos).draft())
            return
        self._boundary()
        raise Suspend([], ready_at=wake_at, reason="sleeping")
    self._boundary()
    if seconds <= 0:
        self._journal.defer(Woke(pos).draft())
        return
    wake_at = now + float(seconds)
    raise Suspend(
        [Dormant.sleep(pos, wake_at, float(seconds)).draft()],
        ready_at=wake_at,
        reason=f"sleep {seconds}s",
    )


async def wait_for(self: Run, event: str, *, timeout: float | None = None,
                   prompt: Any = None, choices: Sequence[Any] | None = None) -> Any:
    """Wait for the event ``event``; return its payload, or ``None`` after ``timeout`` s.

    Events sent before the agent waits are kept and delivered in order. ``prompt`` (a
    JSON value: the question, or a document describing it) and ``choices`` (the answers
    offered) are recorded with the wait, so callers see what the agent asks while it
    waits (``ObjectInfo.asking``, ``App.questions``, ``perdure show``); an answer is
    ``App.send(object_id, event, payload)``.
    """
    if timeout is not None and hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    check_name(event, "event name")
    offered = check_question(event, prompt, choices)
    pos, recs = self._take("wait", event)
    if self._update_handlers or self._update_validators or any(
            ev.name == UPDATE_EVENT for ev in self._pending):
        ended = (find(recs, Kind.EVENT_RECEIVED) is not None
                 or find(recs, Kind.WAIT_TIMED_OUT) is not None)
        await self._take_updates(live=not ended)
    got = find(recs, Kind.EVENT_RECEIVED)
    if got is not None:
        return detached(got.body.get("payload"))
    if find(recs, Kind.WAIT_TIMED_OUT) is not None:
        return None
    self._boundary()
    arrived, payload = await _receive(self, pos, event)
    if arrived:
        return payload
    dormant = find(recs, Kind.DORMANT)
    now = self._clock()
    if dormant is not None:
        deadline = dormant.body.get("wake_at")
        drafts: list[RecordDraft] = []
        # What memory says it asks (the code may ask otherwise now: memory is the truth).
        prompt, asked = dormant.body.get("prompt"), dormant.body.get("choices")
        offered = tuple(asked) if isinstance(asked, list) else None
    else:
        deadline = now + float(timeout) if timeout is not None else None
        drafts = [Dormant.wait(pos, event, deadline, *_kept(self, event, prompt, offered)
                               ).draft()]
    if deadline is not None and now >= deadline:
        self._journal.defer(WaitTimedOut(pos, event).draft())
        return None
    note = (asking_note(event, *_kept(self, event, prompt, offered))
            if prompt is not None or offered is not None else None)
    raise Suspend(drafts, ready_at=deadline, waiting_event=event,
                  reason=f"waiting for event {event!r}", note=note)


async def _receive(self: Run, pos: int | str, event: str) -> tuple[bool, Any]:
    """Take the first event ``event`` of the inbox that its seal vouches for: ``(True,
    payload)``, its receipt deferred to the next commit; ``(False, None)`` if none."""
    for ev in await _inbox(self, event):
        if ev.name == event and ev.event_id not in self._consumed:
            self._consumed.add(ev.event_id)
            digest = vouched(self, ev)
            if digest is None:
                continue  # refused, with a record that says why
            try:
                payload = decode(ev.payload)
            except ValueError:
                payload = {"undecodable_payload": ev.payload.decode("utf-8", "replace")}
            if self._sealer is not None and self._sealer.seal_all and not marked(ev.payload):
                # Sent in clear to an agent that encrypts all: sealed before memory keeps it.
                payload, _ = self._stored(payload, what=f"payload of event {event!r}")
            # Recorded with the next commit (usually the next step's), which marks
            # the event consumed: until then it stays in the inbox, and a crash
            # before that commit delivers it again on replay.
            self._journal.defer(
                EventReceived(pos, event, ev.event_id, payload, digest).draft(),
                consume_event_ids=[ev.event_id],
            )
            return True, self._opened(payload)
    return False, None


async def watch_wait(self: Run, event: str, wake_at: float | None, watch: Sequence[str]
                     ) -> tuple[bool, Any]:
    """Wait for ``event`` until ``wake_at`` (seconds since the epoch; ``None``: no
    timer), or until every run in ``watch`` (children of this object) has ended, which
    comes first: ``(True, payload)`` for the event, ``(False, None)`` otherwise (a
    ``wait_timed_out`` record says so to a replay). A schedule waits this way."""
    pos, recs = self._take("wait", event)
    got = find(recs, Kind.EVENT_RECEIVED)
    if got is not None:
        return True, detached(got.body.get("payload"))
    if find(recs, Kind.WAIT_TIMED_OUT) is not None:
        return False, None
    self._boundary()
    received_now, payload = await _receive(self, pos, event)
    if received_now:
        return True, payload
    dormant = find(recs, Kind.DORMANT)
    if dormant is not None:  # memory is the truth: what the wait was when it began
        wake_at = dormant.body.get("wake_at")
        watch = tuple(dormant.body.get("children", ()))
    ended = bool(watch) and all(child in self._children for child in watch)
    if ended or (wake_at is not None and self._clock() >= wake_at):
        self._journal.defer(WaitTimedOut(pos, event).draft())
        return False, None
    drafts = [] if dormant is not None else [Dormant.wait(pos, event, wake_at,
                                                          watch=watch).draft()]
    raise Suspend(drafts, ready_at=wake_at, waiting_event=event, children=watch,
                  reason=f"waiting for event {event!r}")


def _kept(run: Run, event: str, prompt: Any, offered: tuple[Any, ...] | None
          ) -> tuple[Any, tuple[Any, ...] | None]:
    """A question as memory and the object's note keep it: for an agent that encrypts
    all, the prompt and each choice sealed (the note then reads ``<sealed>``)."""
    if run._sealer is None or not run._sealer.seal_all:
        return prompt, offered
    if prompt is not None:
        prompt = run._stored(prompt, what=f"prompt of the wait for {event!r}")[0]
    if offered is not None:
        offered = tuple(run._stored(choice, what=f"a choice of the wait for {event!r}")[0]
                        for choice in offered)
    return prompt, offered


def check_question(event: str, prompt: Any, choices: Sequence[Any] | None
                   ) -> tuple[Any, ...] | None:
    """``choices`` as a tuple, after checking that ``prompt`` and ``choices`` are JSON
    values memory can hold (``SerializationError``; ``ConfigurationError`` for choices
    that are not a list)."""
    if prompt is not None:
        encode(prompt, what=f"prompt of the wait for {event!r}", max_depth=MAX_DEPTH)
    if choices is None:
        return None
    if isinstance(choices, str | bytes | Mapping) or not isinstance(choices, Sequence):
        raise ConfigurationError(
            f"choices of the wait for {event!r} must be a list of JSON values, "
            f"not {type(choices).__name__}")
    offered = tuple(choices)
    encode(list(offered), what=f"choices of the wait for {event!r}", max_depth=MAX_DEPTH)
    return offered


def vouched(run: Run, ev: Event) -> str | None:
    """The digest of ``ev`` if its seal verifies under a trusted key and memory has
    not received it before; otherwise ``None``, with a refusal deferred to the next
    commit (which consumes the event, so it never comes back)."""
    if run._check_event is None:
        return ""
    digest, problem = run._check_event(ev)
    if problem is None and digest is not None and digest in received(run):
        problem = "memory already holds an event with this digest (a replayed copy)"
    if problem is None:
        assert digest is not None
        received(run).add(digest)
        return digest
    run._journal.defer(
        EventRefused(ev.event_id, ev.name, digest, problem).draft(),
        consume_event_ids=[ev.event_id],
    )
    run.refused.append((ev.event_id, ev.name, problem))
    return None


def received(run: Run) -> set[str]:
    """Digests of the events memory holds as received (read once, then kept)."""
    if run._digests is None:
        found = {str(rec.body["event_hash"]) for recs in run._history.values()
                 for rec in recs if rec.kind == _EVENT_RECEIVED}
        found.update(str(body["event_hash"]) for body in run._children.values()
                     if body.get("event_hash"))
        found.update(run._refined)
        found.discard("None")
        run._digests = found
    return run._digests


async def _inbox(run: Run, name: str) -> Sequence[Event]:
    """The pending events, for a wait for ``name``: the inbox as the worker read it
    before running the agent, the first time and if it holds such an event (usually
    the one that woke the object), else as the store has it now."""
    pending, run._pending = run._pending, ()
    for ev in pending:
        if ev.name == name and ev.event_id not in run._consumed:
            return pending
    return await run._load_events()
