"""Calling user code: an agent against its memory, and a step's function.

``invoke`` is the one way an agent is run against a ``Run``: the node's execute
action and the replay checker (``engine/replay.py``) both call it, so checking a
deploy runs the agent exactly as resuming an object does. ``async def`` code runs on
the event loop; a plain ``def`` agent runs on a code thread with a ``SyncRun``, and a
plain ``def`` step on a code thread too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from inspect import CO_COROUTINE
from types import FunctionType
from typing import Any

from perdure.core.intent import Intent
from perdure.engine.checkpoints import Marks
from perdure.engine.code_threads import CodeThreads
from perdure.engine.context import StepInfo, step_scope
from perdure.engine.restore import close_resources, restore_resources
from perdure.engine.run import Run, SyncRun
from perdure.engine.settings import AgentDef

__all__ = ["StepRunner", "invoke", "served"]


def served(agents: Mapping[str, AgentDef], intent: Intent) -> AgentDef | None:
    """The agent ``intent`` names, if ``agents`` has it at the intent's version."""
    agent = agents.get(intent.agent)
    if agent is None or agent.version != intent.version:
        return None
    return agent


async def invoke(agent: AgentDef, run: Run, threads: CodeThreads) -> Any:
    """Run ``agent`` against ``run`` (its memory) with the intent's arguments; its result.

    Whatever unwinds the agent (a signal such as ``Suspend`` or ``Park``, the agent's
    own exception) propagates to the caller, who decides what it means. A run that
    returns with work still open raises as ``Run.check_finished`` says.
    """
    intent = run.intent
    slots = run._journal.slots
    if run._journal.committer is not None:  # (a replay check restores nothing)
        if slots is not None:
            run._slots = await slots.load(run.object_id, run._records)
            if run._journal.slot_rows is None:  # none read now, none written yet: none
                run._journal.slot_rows = bool(run._slots)
        await restore_resources(run, run._records)
    run._update_validators = agent.updates
    try:
        if agent.is_async:
            result = await agent.fn(run, *intent.args, **intent.kwargs)
        else:
            sync = SyncRun(run, asyncio.get_running_loop())
            result = await threads.run(lambda: agent.fn(sync, *intent.args, **intent.kwargs))
        run.check_finished()
    finally:
        if run._held or run._replayed:
            await close_resources(run)
    return result


class StepRunner:
    """Runs a step's function for a run (``run`` is a ``Run``'s step executor)."""

    def __init__(self, threads: CodeThreads) -> None:
        self._threads = threads

    async def run(self, info: StepInfo, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` with ``current_step()`` telling ``info``: awaited on
        the loop if it is ``async def``, else on a code thread."""
        token = step_scope.set(info)
        failed = True
        try:
            # An ``async def`` function says so in its code flags: a cheaper test than
            # ``iscoroutinefunction``'s, which still decides everything else.
            if ((type(fn) is FunctionType and fn.__code__.co_flags & CO_COROUTINE)
                    or asyncio.iscoroutinefunction(fn)):
                result = await fn(*args, **kwargs)
                failed = False
                return result

            def call() -> Any:
                # Pool threads are reused (also for sync agent code): reset, never leak.
                inner = step_scope.set(info)
                try:
                    return fn(*args, **kwargs)
                finally:
                    step_scope.reset(inner)

            result = await self._threads.run(call)
            failed = False
            return result
        finally:
            step_scope.reset(token)
            marks = info._marks
            if type(marks) is Marks and marks.used:  # progress markers: engine.checkpoints
                await marks.close(flush=failed)
