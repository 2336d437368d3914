"""``SyncRun``: the ``Run`` API without ``await``, for plain ``def`` agents.

A plain ``def`` agent runs on a pool thread, off the event loop; each command is
handed to the loop (``run_coroutine_threadsafe``) and the thread waits for its
outcome, so the one async ``Run`` does all the work and the two APIs cannot drift.
``is_async`` decides which of the two an agent gets.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from perdure.core.intent import Context, Intent

if TYPE_CHECKING:
    from perdure.engine.commands.agent_loop import AgentResult
    from perdure.engine.commands.lineage import ChildStarter
    from perdure.engine.run import Run
    from perdure.llm import ModelClient, ModelReply, ModelRequest
    from perdure.resources import Resource

__all__ = ["SyncChildHandle", "SyncChildStarter", "SyncRun", "is_async"]

T = TypeVar("T")


class SyncRun:
    """The ``Run`` API without ``await``, for plain ``def`` agents running off the event loop."""

    def __init__(self, run: Run, loop: asyncio.AbstractEventLoop) -> None:
        self._run = run
        self._loop = loop

    def _call(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    @property
    def object_id(self) -> str:
        """This object's id."""
        return self._run.object_id

    @property
    def intent(self) -> Intent:
        """The current intent."""
        return self._run.intent

    @property
    def context(self) -> Context:
        """Identity, lineage and labels."""
        return self._run.context

    @property
    def epoch(self) -> int:
        """The fencing epoch."""
        return self._run.epoch

    @overload
    def step(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T: ...

    @overload
    def step(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

    def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """See ``Run.step``: the same options, without ``await``."""
        return self._call(self._run.step(fn, *args, **kwargs))

    def sleep(self, seconds: float) -> None:
        """See ``Run.sleep``."""
        self._call(self._run.sleep(seconds))

    def wait_for(self, event: str, *, timeout: float | None = None, prompt: Any = None,
                 choices: Sequence[Any] | None = None) -> Any:
        """See ``Run.wait_for``."""
        return self._call(self._run.wait_for(event, timeout=timeout, prompt=prompt,
                                             choices=choices))

    def now(self) -> float:
        """See ``Run.now``."""
        return self._call(self._run.now())

    def uuid(self) -> str:
        """See ``Run.uuid``."""
        return self._call(self._run.uuid())

    def random(self) -> float:
        """See ``Run.random``."""
        return self._call(self._run.random())

    def patched(self, name: str) -> bool:
        """See ``Run.patched``."""
        return self._run.patched(name)

    def deprecate_patch(self, name: str) -> None:
        """See ``Run.deprecate_patch``."""
        self._run.deprecate_patch(name)

    def refine(self, **changes: Any) -> Intent:
        """See ``Run.refine``."""
        return self._call(self._run.refine(**changes))

    def delegate(self, agent: Callable[..., Any] | str, /, *args: Any,
                 **kwargs: Any) -> SyncChildHandle:
        """See ``Run.delegate``; the handle's ``result()`` waits without ``await``."""
        handle = self._call(self._run.delegate(agent, *args, **kwargs))
        return SyncChildHandle(self, handle.child_id)

    def options(self, *, object_id: str | None = None) -> SyncChildStarter:
        """See ``Run.options``: ``run.options(object_id="kid").delegate(agent, ...)``."""
        return SyncChildStarter(self, self._run.options(object_id=object_id))

    def join(self, *children: SyncChildHandle | str) -> list[Any]:
        """See ``Run.join``."""
        ids = [c.child_id if isinstance(c, SyncChildHandle) else c for c in children]
        return self._call(self._run.join(*ids))

    def model(self, client: ModelClient | Sequence[ModelClient | tuple[ModelClient, str]],
              request: ModelRequest | None = None, **options: Any) -> ModelReply:
        """See ``Run.model``: the same arguments, without ``await``."""
        return self._call(self._run.model(client, request, **options))

    def agent(self, client: ModelClient | Sequence[ModelClient | tuple[ModelClient, str]],
              **options: Any) -> AgentResult:
        """See ``Run.agent``: the same arguments, without ``await``."""
        return self._call(self._run.agent(client, **options))

    def progress(self, **fields: Any) -> None:
        """See ``Run.progress``."""
        self._call(self._run.progress(**fields))

    def emit(self, name: str, data: Any = None) -> None:
        """See ``Run.emit``."""
        self._call(self._run.emit(name, data))
    def resource(self, name: str, recipe: Resource[T]) -> T:
        """See ``Run.resource`` (the live thing is made on the event loop: an async
        session such as ``PostgresSession``'s is for ``async def`` code)."""
        return self._call(self._run.resource(name, recipe))

    def release(self, name: str) -> None:
        """See ``Run.release``."""
        self._call(self._run.release(name))

    def checkpoint_resources(self, *names: str) -> int:
        """See ``Run.checkpoint_resources``."""
        return self._call(self._run.checkpoint_resources(*names))


class SyncChildStarter:
    """Delegates child objects with options, for a plain ``def`` agent (``SyncRun.options``)."""

    __slots__ = ("_run", "_starter")

    def __init__(self, run: SyncRun, starter: ChildStarter) -> None:
        self._run = run
        self._starter = starter

    def delegate(self, agent: Callable[..., Any] | str, /, *args: Any,
                 **kwargs: Any) -> SyncChildHandle:
        """``run.delegate(agent, *args, **kwargs)`` with these options."""
        handle = self._run._call(self._starter.delegate(agent, *args, **kwargs))
        return SyncChildHandle(self._run, handle.child_id)


class SyncChildHandle:
    """A delegated child object, from inside a plain ``def`` parent."""

    def __init__(self, run: SyncRun, child_id: str) -> None:
        self._run = run
        self.child_id = child_id

    def __repr__(self) -> str:
        return f"SyncChildHandle({self.child_id!r})"

    def result(self) -> Any:
        """Wait (dormant) for the child; its result or ``ChildFailedError``."""
        return self._run.join(self)[0]


def is_async(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions (and callables whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method itself, not callability
    )
