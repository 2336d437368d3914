"""A pytest plugin: fail any test during which a worker's event loop stalled over 100 ms.

Nothing slow may run on a worker's loop (leases go unrenewed, streams unread, other
objects stuck). Every ``Worker.run`` in the test process gets a ``LoopWatchdog``; worker
subprocesses get ``PERDURE_WARN_STALLS`` (set here for the whole session, inherited by
every process a test starts), and a test's acceptance cluster logs are checked for the
``event loop stalled`` line they write. A stall fails the test with the stack that was
blocking the loop. ``PERDURE_TEST_STALL_MS`` changes the limit (0 turns it off).

Hooked from ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from perdure.engine.stalls import LoopWatchdog, Stall
from perdure.engine.worker import Worker

__all__ = ["STALL_LINE", "stall_watchdog"]

LIMIT_MS = float(os.environ.get("PERDURE_TEST_STALL_MS", "100"))
STALL_LINE = "event loop stalled for"

if LIMIT_MS > 0:
    os.environ.setdefault("PERDURE_WARN_STALLS", f"{LIMIT_MS:g}")


@pytest.fixture(autouse=True)
def stall_watchdog(request: pytest.FixtureRequest,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Stall]]:
    """Watch every worker loop the test runs; fail the test if one stalled."""
    stalls: list[Stall] = []
    if LIMIT_MS <= 0 or request.node.get_closest_marker("loop_stalls_allowed"):
        yield stalls
        return
    run = Worker.run

    async def watched(self: Worker, *args: Any, **kwargs: Any) -> int:
        watchdog = LoopWatchdog(LIMIT_MS / 1000, stalls.append)
        watchdog.start()
        try:
            return await run(self, *args, **kwargs)
        finally:
            watchdog.stop()

    monkeypatch.setattr(Worker, "run", watched)
    yield stalls
    found = [f"{s.seconds * 1000:.0f} ms at:\n{s.stack}" for s in stalls]
    for value in getattr(request.node, "funcargs", {}).values():
        logs = getattr(value, "logs", None)
        text = logs() if callable(logs) and type(value).__name__ == "Cluster" else ""
        found += [line for line in str(text).splitlines() if STALL_LINE in line]
    if found:
        pytest.fail(f"a worker's event loop stalled over {LIMIT_MS:g} ms "
                    f"({len(found)} time(s)):\n" + "\n".join(found), pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker that exempts a test (one that blocks a loop on purpose)."""
    config.addinivalue_line("markers", "loop_stalls_allowed: the test blocks a worker's "
                            "loop on purpose; the stall watchdog leaves it alone")
