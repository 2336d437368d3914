"""Noticing a blocked event loop: a watchdog thread that says when the loop stalls.

Nothing slow may run on a worker's event loop: while it is blocked, leases are not
renewed, other objects do not move and streams are not read. ``LoopWatchdog`` finds out
when something does. A task on the loop beats every ``interval``; a thread checks the
beat and, when it is older than ``threshold``, takes the loop thread's stack (what was
blocking it) and reports the stall, with its length, once the loop beats again.

Waiting for a CPU (a loaded machine) is not a stall of the loop. On Linux the kernel
counts, per thread, the time it sat runnable in the run queue (``schedstat``); that time
of the loop thread is taken off each gap. A gap the loop spent waiting in its selector
while the process hardly used the CPU is excused too (the loop was not scheduled, or
waited for the GIL held by a thread that was not; a thread keeping the GIL busy would
have used the CPU, and is reported with the other threads' stacks). A late beat during
which the process's other threads sat in the run queue for half the time or more is
excused: the loop may have waited for the GIL one of them held (a thread preempted while
holding it keeps every other thread waiting). Where the kernel
does not count, and for a process stopped outright (SIGSTOP), a cruder rule stands in:
when the watchdog thread itself woke late and the process used little CPU meanwhile,
that time is excused. What is reported is time
the loop spent running something slow or blocked in a call; a stall the watchdog thread
only looked at once the loop was beating again (it had no CPU itself) has no stack to
show and is not reported. Off by default;
``perdure worker --warn-stalls MS`` turns it on (the test suite does, and fails a test
during which a worker's loop stalled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LAG_INTERVAL", "LoopLagMeter", "LoopWatchdog", "Stall"]

LAG_INTERVAL = 0.25
"""How often a node measures its event loop's lag (seconds)."""

log = logging.getLogger("perdure.worker")


@dataclass(frozen=True, slots=True)
class Stall:
    """The loop did not run for ``seconds``; ``stack`` is where it was when noticed."""

    seconds: float
    stack: str


def _queued(thread: int) -> float | None:
    """Seconds the thread (native id) has spent runnable but waiting for a CPU, from the
    kernel's ``schedstat``; ``None`` where the kernel does not say."""
    try:
        with open(f"/proc/self/task/{thread}/schedstat", "rb") as file:
            return int(file.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _others_queued(loop_thread: int) -> float | None:
    """Seconds the process's other threads have spent runnable but waiting for a CPU
    (``schedstat``), the loop thread (native id) left out; ``None`` where not counted."""
    total = 0.0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        if task == str(loop_thread):
            continue
        try:
            with open(f"/proc/self/task/{task}/schedstat", "rb") as file:
                queued = file.read().split()[1]
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        total += int(queued) / 1e9
    return total


def _logged(stall: Stall) -> None:
    log.warning("event loop stalled for %.0f ms at:\n%s", stall.seconds * 1000, stall.stack,
                extra={"action": "loop_stalled"})


class LoopLagMeter:
    """A node's own measure of its loop's lag, always on (unlike the watchdog): a task
    asks to wake every ``interval`` and notes how late it woke. ``worst`` is the worst
    lag seen; ``on_lag(seconds, worst)`` hears each measure (the node sends it to its
    hooks as ``LoopLag`` when anyone listens). It costs one timer per ``interval``."""

    def __init__(self, on_lag: Callable[[float, float], None] | None = None,
                 interval: float = LAG_INTERVAL) -> None:
        self.interval = interval
        self.on_lag = on_lag
        self.worst = 0.0

    async def run(self) -> None:
        """Measure until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            lag = max(0.0, loop.time() - due)
            if lag > self.worst:
                self.worst = lag
            if self.on_lag is not None:
                self.on_lag(lag, self.worst)


class LoopWatchdog:
    """Watch the running event loop (see the module); ``start`` on the loop, ``stop``."""

    def __init__(self, threshold: float, on_stall: Callable[[Stall], None] = _logged,
                 interval: float = 0.01) -> None:
        self.threshold = threshold
        self.on_stall = on_stall
        self.interval = interval
        self._beat = time.monotonic()
        self._stack: str | None = None
        self._excused = 0.0
        self._beat_cpu = time.process_time()
        self._idle = False
        self._done = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread = 0
        self._loop_native = 0
        self._scheduled = False  # the kernel counts the loop thread's run-queue wait
        self._beat_queued = 0.0
        # The other threads' run-queue wait, taken by the watch thread once a beat is
        # late: (the beat it belongs to, when taken, seconds queued).
        self._others: tuple[float, float, float] | None = None

    def _waited(self) -> float:
        """The loop thread's wait for a CPU since its last beat (0 where not counted)."""
        if not self._scheduled:
            return 0.0
        queued = _queued(self._loop_native)
        return 0.0 if queued is None else max(0.0, queued - self._beat_queued)

    async def _beats(self) -> None:
        while True:
            now = time.monotonic()
            waited = self._waited()
            gap = now - self._beat - self._excused - waited
            stack, self._stack = self._stack, None
            cpu = time.process_time()
            # Waiting in its selector the whole time while the process hardly ran (no
            # thread keeping the GIL busy): the loop was not scheduled, or waited for the
            # GIL held by a thread that was not, and was not blocked.
            idle = self._idle and cpu - self._beat_cpu < gap / 2
            if (stack is not None and gap > self.threshold and not idle
                    and not self._contended(now)):
                self.on_stall(Stall(gap, stack))
            self._beat, self._beat_cpu, self._excused, self._idle = now, cpu, 0.0, False
            self._beat_queued += waited
            await asyncio.sleep(self.interval)

    def _contended(self, now: float) -> bool:
        """Whether the process's other threads waited for a CPU for at least half of the
        late stretch of this beat: then the loop may have waited for the GIL held by one
        of them that the kernel had put aside, which is no call of the loop's. A call on
        the loop that blocks while the rest of the process runs or rests is reported."""
        others = self._others
        if others is None or others[0] != self._beat:
            return False
        queued = _others_queued(self._loop_native)
        return queued is not None and queued - others[2] >= (now - others[1]) / 2

    def _watch(self) -> None:
        last, cpu = time.monotonic(), time.process_time()
        while not self._done.wait(self.interval):
            now, used = time.monotonic(), time.process_time()
            slept = now - last
            if slept > 5 * self.interval and used - cpu < slept / 2:
                # This thread woke late and the process hardly ran: the whole process had
                # no CPU, or was stopped (SIGSTOP): not the loop's doing.
                self._excused += slept
            last, cpu = now, used
            beat = self._beat
            if (self._scheduled and now - beat > self.threshold / 4
                    and (self._others is None or self._others[0] != beat)):
                queued = _others_queued(self._loop_native)
                if queued is not None:
                    self._others = (beat, now, queued)
            if self._stack is None and (now - self._beat - self._excused - self._waited()
                                        > self.threshold):
                self._stack = self._where()

    def _where(self) -> str | None:
        """The loop thread's stack; when it is only waiting in ``select`` (held up by
        another thread keeping the GIL), the other threads' stacks too. ``None`` when the
        loop is already in its beat: this thread looked too late to see what held it."""
        frames = sys._current_frames()
        frame = frames.get(self._loop_thread)
        outer = frame
        while outer is not None:
            if outer.f_code is _BEATS_CODE:
                return None
            outer = outer.f_back
        stack = "".join(traceback.format_stack(frame)) if frame else "?"
        if frame is None or frame.f_code.co_name not in ("select", "poll", "_run_once"):
            return stack
        self._idle = True
        others = [f"thread {ident}:\n" + "".join(traceback.format_stack(other))
                  for ident, other in frames.items()
                  if ident not in (self._loop_thread, threading.get_ident())]
        return stack + "the loop was idle; the other threads were at:\n" + "\n".join(others)

    def start(self) -> None:
        """Begin watching the running loop (call on it)."""
        self._loop_thread = threading.get_ident()
        self._loop_native = threading.get_native_id()
        queued = _queued(self._loop_native)
        self._scheduled, self._beat_queued = queued is not None, queued or 0.0
        self._beat = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._beats())
        self._thread = threading.Thread(target=self._watch, name="perdure-stall-watch",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._done.set()
        if self._task is not None:
            self._task.cancel()
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._thread.join(timeout=1.0)


_BEATS_CODE = LoopWatchdog._beats.__code__
