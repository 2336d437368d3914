"""``VirtualClock``: the time of a test environment, which a test can skip ahead.

It runs with the real time (so that what takes real time, such as a step's work, still
moves it) from a start of its own, and jumps when told to: ``skip(seconds)`` or
``skip_to(when)``. It never goes back. An ``App`` given it (``App(clock=...)``) stamps
records, sets timers, deadlines and approval deadlines and answers ``run.now()`` by it;
nothing else in the process is touched (no patch of ``time``).
"""

from __future__ import annotations

import math
import threading
import time

from perdure.errors import ConfigurationError

__all__ = ["VirtualClock"]


class VirtualClock:
    """Seconds since the epoch, as ``time.time`` gives them, that a test can skip ahead.

    ``start`` is where it begins (default: the real time now). Calling it gives the
    time now: ``start`` plus the real time passed since it was made plus every skip.
    Safe to call and skip from any thread; what it gives never decreases.
    """

    def __init__(self, start: float | None = None) -> None:
        if start is not None and (isinstance(start, bool) or not isinstance(start, int | float)
                                  or not math.isfinite(start) or start < 0):
            raise ConfigurationError(f"a clock's start is seconds since the epoch, not "
                                     f"{start!r}")
        self._start = time.time() if start is None else float(start)
        self._began = time.monotonic()
        self._skipped = 0.0
        self._last = self._start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            now = self._start + (time.monotonic() - self._began) + self._skipped
            if now < self._last:
                now = self._last
            self._last = now
            return now

    def __repr__(self) -> str:
        return f"VirtualClock(now={self():.3f}, skipped={self._skipped:g})"

    @property
    def start(self) -> float:
        """Where the clock began (seconds since the epoch)."""
        return self._start

    @property
    def elapsed(self) -> float:
        """Seconds since the clock began, skips included: what the objects lived through."""
        return self() - self._start

    @property
    def skipped(self) -> float:
        """How many seconds the clock was skipped ahead in all (``elapsed`` less the real
        time that passed)."""
        return self._skipped

    def skip(self, seconds: float) -> float:
        """Move the clock ``seconds`` ahead (0 or more); the time now after the skip."""
        if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                or not math.isfinite(seconds) or seconds < 0):
            raise ConfigurationError(f"a skip is 0 or more seconds, not {seconds!r}")
        with self._lock:
            self._skipped += float(seconds)
        return self()

    def skip_to(self, when: float) -> float:
        """Move the clock ahead to ``when`` (nothing happens if it is there already); the
        time now after the skip."""
        if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
            raise ConfigurationError(f"a time is seconds since the epoch, not {when!r}")
        return self.skip(max(0.0, float(when) - self()))
