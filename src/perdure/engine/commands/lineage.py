"""Children and branches: ``run.delegate`` and ``run.options``, ``run.join``, ``run.gather``.

``delegate``: the replay rule is that a ``delegated`` record at the position names
the child, which is not created again; the execution rule creates the child (on
any node; idempotent on its id) and records it.

``join``: children's terminal signals arrive in the parent's inbox (``CHILD_EVENT``)
and are folded into memory as ``child_finished`` records, which replay reads; while
a child is still running the object is dormant, waking once when the last is done.

``gather``: each branch's commands take positions under the branch's place in the
call (see ``positions``), so after a crash only branches without a record run again;
branches that go dormant go dormant together, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perdure.core.bodies import ChildFinished, Delegated, Dormant
from perdure.core.codec import decode, detached
from perdure.core.intent import Context
from perdure.core.lifecycle import Status
from perdure.core.names import check_object_id
from perdure.core.records import Kind, Record, RecordDraft
from perdure.engine.commands.positions import Branch, branch, find
from perdure.engine.commands.steps import qualname
from perdure.engine.commands.waits import vouched
from perdure.engine.signals import DeadlineExceeded, Park, Suspend
from perdure.errors import (
    CancelRequestedError,
    ChildFailedError,
    LeaseLostError,
    ObjectConflictError,
    PerdureSignal,
)

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = [
    "CHILD_EVENT",
    "ChildHandle",
    "ChildStarter",
    "Spawn",
    "child_finished_body",
    "delegate",
    "gather",
    "join",
    "options",
]

CHILD_EVENT = "perdure:child"  # a child's terminal signal in its parent's inbox

#: How a run creates a child object: ``(agent, args, kwargs, child_id, parent context,
#: start_at)`` -> the child's agent version (``engine.lineage.spawn``).
Spawn = Callable[[Any, tuple[Any, ...], dict[str, Any], str, Context, float | None],
                 Awaitable[str]]

# When gather's branches end differently, these signals unwind it first, the most
# urgent first whatever the branches' order: a park (a person must look), a lost lease,
# a cancel, the deadline.
_URGENT: tuple[type[PerdureSignal], ...] = (
    Park, LeaseLostError, CancelRequestedError, DeadlineExceeded)


def child_finished_body(payload: bytes, event_id: int, digest: str | None = None
                        ) -> ChildFinished | None:
    """The ``child_finished`` record body for a child's terminal signal, or ``None``."""
    try:
        body = decode(payload)
    except ValueError:
        return None
    if not isinstance(body, dict) or "child_id" not in body:
        return None
    return ChildFinished.signalled(body, event_id, digest)


class ChildHandle:
    """A delegated child object, from inside its parent. ``await`` it for its result."""

    def __init__(self, run: Run, child_id: str) -> None:
        self._run = run
        self.child_id = child_id

    def __repr__(self) -> str:
        return f"ChildHandle({self.child_id!r})"

    async def result(self) -> Any:
        """Wait (dormant) for the child to terminate; its result or ``ChildFailedError``."""
        return (await self._run.join(self))[0]

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result().__await__()


@dataclass(frozen=True, slots=True)
class ChildStarter:
    """Delegates child objects with options (``run.options(object_id=...)``): every
    argument of ``delegate`` goes to the child's agent."""

    run: Run
    object_id: str | None = None

    async def delegate(self, agent: Callable[..., Any] | str, /, *args: Any,
                       **kwargs: Any) -> ChildHandle:
        """``run.delegate(agent, *args, **kwargs)`` with these options."""
        return await _delegate(self.run, agent, args, kwargs, self.object_id)


def options(self: Run, *, object_id: str | None = None) -> ChildStarter:
    """How to delegate child objects: ``await run.options(object_id="kid").delegate(
    agent, *args, **kwargs)`` names the child ``object_id`` (``None``: ``<this
    id>.<position>``). An unknown option is a ``TypeError``, a bad id a
    ``ConfigurationError``, here."""
    if object_id is not None:
        check_object_id(object_id, "child object id")
    return ChildStarter(self, object_id)


async def delegate(self: Run, agent: Callable[..., Any] | str, /, *args: Any,
                   **kwargs: Any) -> ChildHandle:
    """Create a child object running ``agent(*args, **kwargs)``, on any node.

    The child has its own intent, context and memory, with this object as parent
    (and the same root and trace). ``await child`` (or ``await child.result()``)
    makes this object dormant until the child terminates, then returns its result
    or raises ``ChildFailedError``. Its id is ``<this id>.<position>``, the same on
    every replay, or the one given with ``run.options(object_id=...).delegate(...)``.
    Every argument goes to the child's agent, whatever its name.
    """
    return await _delegate(self, agent, args, kwargs, None)


async def _delegate(self: Run, agent: Callable[..., Any] | str, args: tuple[Any, ...],
                    kwargs: dict[str, Any], object_id: str | None,
                    start_at: float | None = None) -> ChildHandle:
    name = agent if isinstance(agent, str) else str(
        getattr(agent, "__perdure_agent__", None) or qualname(agent))
    if object_id is not None:
        check_object_id(object_id, "child object id")
    key, recs = self._take("delegate", name)
    rec = find(recs, Kind.DELEGATED)
    if rec is not None:
        return ChildHandle(self, str(rec.body["child_id"]))
    self._boundary()
    if self._spawn is None:
        raise RuntimeError("delegation needs a running node")
    child_id = object_id or f"{self.object_id}.{key}"
    earlier = _delegated_at(self, child_id)
    if earlier is not None:
        raise ObjectConflictError(
            f"cannot delegate to {child_id!r} at command #{key}: this object delegated to "
            f"it already at command #{earlier}; give each child its own object_id")
    version = await self._spawn(agent, tuple(args), dict(kwargs), child_id, self._context,
                                start_at)
    await self._journal.commit([Delegated(key, name, child_id, version).draft()])
    self._journal.delegated.append(child_id)
    return ChildHandle(self, child_id)


def _delegated_at(run: Run, child_id: str) -> int | str | None:
    """The position at which memory (or this run) delegated to ``child_id``, if any."""
    for recs in run._history.values():
        for rec in recs:
            if rec.kind == Kind.DELEGATED and rec.body.get("child_id") == child_id:
                pos: int | str | None = rec.body.get("pos")
                return pos
    if child_id in run._journal.delegated:
        return "earlier in this run"
    return None


async def join(self: Run, *children: ChildHandle | str) -> list[Any]:
    """Wait for every child to terminate; their results in order.

    The object is dormant meanwhile and wakes once, when the last of them is
    done. The first child (in argument order) that failed raises
    ``ChildFailedError``.
    """
    ids = [c.child_id if isinstance(c, ChildHandle) else str(c) for c in children]
    key, recs = self._take("join", ",".join(ids))
    drafts: list[RecordDraft] = []
    consume: list[int] = []
    if any(c not in self._children for c in ids):
        for ev in await self._load_events():
            if ev.name != CHILD_EVENT or ev.event_id in self._consumed:
                continue
            self._consumed.add(ev.event_id)
            digest = vouched(self, ev)
            if digest is None:
                continue
            finished = child_finished_body(ev.payload, ev.event_id, digest)
            consume.append(ev.event_id)
            if finished is not None and finished.child_id not in self._children:
                body = finished.encode()
                self._children[finished.child_id] = body
                drafts.append(RecordDraft(finished.kind, body))
    waiting = [c for c in ids if c not in self._children]
    if waiting:
        self._boundary()
        if find(recs, Kind.DORMANT) is None:
            drafts.append(Dormant.join(key, ids, CHILD_EVENT).draft())
        raise Suspend(drafts, ready_at=None, waiting_event=CHILD_EVENT, children=ids,
                      consume_event_ids=consume,
                      reason=f"waiting for {len(waiting)} child object(s)")
    if drafts:
        await self._journal.commit(drafts, consume_event_ids=consume)
    results = []
    for child_id in ids:
        body = self._children[child_id]
        if body.get("outcome") != Status.COMPLETED:
            error = body.get("error") or {}
            raise ChildFailedError(child_id, str(body.get("outcome")),
                                   str(error.get("type", "unknown")),
                                   str(error.get("message", "")))
        results.append(detached(body.get("result")))
    return results


async def gather(self: Run, *branches: Awaitable[Any]) -> list[Any]:
    """Run branches concurrently; their results in argument order.

    Each branch's commands take positions from the branch's place in this call,
    never from the order the branches happen to finish, so after a crash only
    branches without a record run again and finished ones return their records.
    Branches may be steps, child handles, or any coroutine using this run. If
    any branch goes dormant, the object waits (once) for all of them; the first
    failing branch, in argument order, raises.
    """
    key, recs = self._take("gather", None)
    self._branched = True  # for good: a branch's own tasks may outlive this call
    tasks: list[asyncio.Future[Any]] = []
    for index, awaitable in enumerate(branches):
        token = branch.set(Branch(f"{key}.{index}"))
        try:
            tasks.append(asyncio.ensure_future(awaitable))
        finally:
            branch.reset(token)
    if tasks:
        await asyncio.wait(tasks)
    failures: list[BaseException | None] = []
    for task in tasks:
        if task.cancelled():
            failures.append(asyncio.CancelledError())
        else:
            failures.append(task.exception())
    unwinding = _unwinding(failures)
    if unwinding is not None:
        raise unwinding
    suspends = [exc for exc in failures if isinstance(exc, Suspend)]
    if suspends:
        raise _combined(key, recs, suspends)
    for exc in failures:
        if exc is not None:
            raise exc
    return [task.result() for task in tasks]


def _unwinding(failures: Sequence[BaseException | None]) -> BaseException | None:
    """What unwinds the whole gather before its dormant branches and plain failures are
    looked at: an urgent signal (``_URGENT``, in its order), else the first other
    signal or ``BaseException`` in argument order (a store that failed mid-run, the end
    of a replay check, the loop's cancellation); ``None`` if there is none."""
    for signal in _URGENT:
        for exc in failures:
            if isinstance(exc, signal):
                return exc
    for exc in failures:
        if exc is not None and not isinstance(exc, Exception | Suspend):
            return exc
    return None


def _combined(key: int | str, recs: Sequence[Record], suspends: Sequence[Suspend]
              ) -> Suspend:
    """The branches that went dormant, as one ``Suspend`` of the whole gather."""
    drafts = [draft for sus in suspends for draft in sus.drafts]
    ready = [sus.ready_at for sus in suspends if sus.ready_at is not None]
    ready_at = min(ready) if ready else None
    events = [sus.waiting_event for sus in suspends if sus.waiting_event]
    children = [child for sus in suspends for child in sus.children]
    status = next((sus.status for sus in suspends if sus.status != Status.DORMANT),
                  Status.DORMANT)
    routed = next((sus for sus in suspends if sus.requires or sus.avoid_node), None)
    if status == Status.DORMANT:
        dormant = Dormant.gather(key, ready_at, events[0] if events else None, children)
        body = dormant.encode()
        last = [r for r in recs if r.kind == Kind.DORMANT]
        if not last or {k: last[-1].body.get(k) for k in body} != body:
            drafts.append(RecordDraft(dormant.kind, body))
    return Suspend(
        drafts, ready_at=ready_at, waiting_event=events[0] if events else None,
        status=status, reason="; ".join(sus.reason for sus in suspends),
        children=children,
        consume_event_ids=[i for sus in suspends for i in sus.consume_event_ids],
        requires=routed.requires if routed else None,
        avoid_node=routed.avoid_node if routed else None,
        note="; ".join(sus.note for sus in suspends if sus.note) or None,
    )
