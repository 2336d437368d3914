"""Stopping a node: stop claiming, let running steps finish and be recorded, then let go.

When its ``stop`` is set the node claims nothing more and asks every object it runs to
let go at its next command boundary (``Run.release_requested``): a step already running
finishes and its outcome is committed as usual, then the object is released ready, for
any node. The node says once what it waits for (which objects, which steps), and waits
up to ``drain_seconds``. When that time passes, or ``abandon`` is set (a second Ctrl-C),
the objects still running are let go at once: their running steps are abandoned, not
recorded, and run again on the next node that takes the object (a non-idempotent step is
then in doubt, as after a crash).

What each object is doing is read from the tasks' suspended frames only at this moment,
so the step path pays nothing for it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from perdure.engine.context import StepInfo
from perdure.engine.invoke import StepRunner
from perdure.engine.node import Node

__all__ = ["Running", "drain", "running_steps"]

log = logging.getLogger("perdure.worker")

_STEP_CODE = StepRunner.run.__code__


@dataclass(frozen=True, slots=True)
class Running:
    """A step running on this node: which, and whether on a code thread (a plain ``def``,
    which nothing can interrupt: a process that abandons it must exit without it)."""

    info: StepInfo
    on_thread: bool

    def __str__(self) -> str:
        return f"step {self.info.name!r} (#{self.info.position})"


def running_steps() -> list[Running]:
    """The steps running on this event loop now (read from the tasks' frames)."""
    found: list[Running] = []
    for task in asyncio.all_tasks():
        # A suspended task's stack is the chain of coroutines each one awaits.
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None and frame.f_code is _STEP_CODE:
                info = frame.f_locals.get("info")
                if isinstance(info, StepInfo):
                    found.append(Running(info, "call" in frame.f_locals))
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom",
                                                                   None)
    return found


def _waiting_on(node: Node) -> str:
    steps: dict[str, list[Running]] = {}
    for item in running_steps():
        steps.setdefault(item.info.object_id, []).append(item)
    parts = []
    for object_id in sorted(node.active):
        mine = steps.get(object_id)
        parts.append(f"{object_id} ({', '.join(map(str, mine))})" if mine
                     else f"{object_id} (between commands)")
    return "; ".join(parts)


async def drain(node: Node, abandon: asyncio.Event | None) -> int:
    """Let the objects ``node`` runs go (see the module); returns how many steps were
    abandoned still running on code threads (the process exits without waiting for
    them only if its owner says so: ``perdure worker`` does)."""
    active_map = node.active
    if not active_map:
        return 0
    for active in active_map.values():
        if active.run is not None:
            active.run.release_requested = True
    seconds = node.settings.drain_seconds
    log.warning("stopping: claiming nothing more; waiting up to %g s for %d object(s) to "
                "finish their steps and be let go: %s. Ctrl-C again to let go at once "
                "(their running steps are then run again elsewhere)", seconds,
                len(active_map), _waiting_on(node), extra={"action": "draining"})
    tasks = {a.task for a in active_map.values()}
    waits: set[asyncio.Future[Any]] = set(tasks)
    abandoned = None
    if abandon is not None:
        abandoned = asyncio.ensure_future(abandon.wait())
        waits.add(abandoned)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    try:
        while tasks:
            left = deadline - loop.time()
            if left <= 0 or (abandoned is not None and abandoned.done()):
                break
            done, _ = await asyncio.wait(waits, timeout=left,
                                         return_when=asyncio.FIRST_COMPLETED)
            tasks -= done
            waits -= done - ({abandoned} if abandoned is not None else set())
    finally:
        if abandoned is not None:
            abandoned.cancel()
    pending = {t for t in tasks if not t.done()}
    if not pending:
        return 0
    why = "on a second Ctrl-C" if abandon is not None and abandon.is_set() else (
        f"after {seconds:g} s")
    left_running = [r for r in running_steps() if r.info.object_id in active_map]
    for item in left_running:
        log.warning("abandoned %s of %s %s: not recorded; it runs again on the next node "
                    "that takes the object", item, item.info.object_id, why,
                    extra={"action": "step_abandoned", "object_id": item.info.object_id})
    for task in pending:
        task.cancel()
    await asyncio.wait(pending, timeout=1.0)
    return sum(1 for r in left_running if r.on_thread)
