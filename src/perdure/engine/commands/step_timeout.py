"""``run.step(fn, timeout=...)``: an attempt that runs too long ends as a ``StepTimeoutError``.

The attempt's function is run as a task (an ``async def``) or on one of the node's code
threads (a plain ``def``, as every step is). When ``timeout`` seconds pass first, the
attempt ends with ``StepTimeoutError``, which the step records as a failure of class
``timeout`` and retries as its retry policy says (``core/backoff.py``: a timeout waits
at least as long as the attempt took before the next one).

What happens to the work that ran too long:

- an ``async def`` function is cancelled (``CancelledError`` is raised at its next
  ``await``); a function that swallows the cancellation runs on, unobserved;
- a plain ``def`` function cannot be stopped from outside in Python: its thread runs on
  until the function returns, and what it returns or raises is dropped. It holds one of
  the node's code threads meanwhile, so a function that may hang for good should bound
  its own I/O (socket timeouts) as well. Either way the attempt's outcome is the
  timeout: a late result is never recorded.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

from perdure.errors import ConfigurationError, StepTimeoutError

__all__ = ["check_timeout", "run_with_timeout"]


def check_timeout(timeout: Any, step_name: str) -> float | None:
    """``timeout`` in seconds (a number above 0, or a ``timedelta``), or ``None``;
    ``ConfigurationError`` for anything else."""
    if timeout is None:
        return None
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
            math.isfinite(timeout) and timeout > 0):
        raise ConfigurationError(
            f"timeout of step {step_name!r} must be a number of seconds above 0, "
            f"not {timeout!r}")
    return float(timeout)


def _drop(task: asyncio.Future[Any]) -> None:
    """Collect what a timed-out attempt ended with, so nothing is reported unretrieved."""
    if not task.cancelled():
        task.exception()


async def run_with_timeout(call: Callable[[], Awaitable[Any]], timeout: float | None,
                           step_name: str) -> Any:
    """``await call()``, or ``StepTimeoutError`` once ``timeout`` seconds have passed (the
    attempt is cancelled; see the module for what that means for a thread)."""
    if timeout is None:
        return await call()
    task = asyncio.ensure_future(call())
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except BaseException:  # the agent itself is being unwound: take the attempt with it
        task.cancel()
        task.add_done_callback(_drop)
        raise
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_drop)
    raise StepTimeoutError(f"step {step_name!r} ran longer than its timeout of {timeout:g}s")
