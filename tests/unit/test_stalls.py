"""The loop watchdog: a loop blocked by its own code is reported with the blocking stack;
a loop that only waited for a CPU (the machine busy with other processes) is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from perdure.engine.stalls import _queued

SCRIPT = textwrap.dedent("""
    import asyncio, json, os, sys, time
    from perdure.engine.stalls import LoopWatchdog

    mode = sys.argv[1]

    def blocking_call():
        time.sleep(0.3)

    async def main():
        stalls, gaps = [], []
        limit = 0.1 if mode == "blocked" else 0.03
        watchdog = LoopWatchdog(limit, stalls.append)
        watchdog.start()
        if mode == "blocked":
            await asyncio.sleep(0.05)
            blocking_call()
            await asyncio.sleep(0.1)
        else:
            # Only the CPU is taken away: every callback is short, but the thread is put
            # last in line behind a process spinning on the same CPU.
            os.sched_setaffinity(0, {0})
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            last, end = time.monotonic(), time.monotonic() + 1.5
            while time.monotonic() < end:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                last = now
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            await asyncio.sleep(0.05)  # a beat with the CPU back, to report what it found
        watchdog.stop()
        print(json.dumps({"stalls": [[s.seconds, s.stack] for s in stalls],
                          "worst_gap": max(gaps, default=0.0), "limit": limit}))

    asyncio.run(main())
""")


def _run(mode: str) -> dict[str, object]:
    spinner = None
    if mode == "starved":
        spinner = subprocess.Popen(
            [sys.executable, "-c", "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"])
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True,
                              text=True, timeout=60, check=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_loop_blocked_by_its_own_call_is_reported_with_the_call() -> None:
    result = _run("blocked")
    stalls = result["stalls"]
    assert isinstance(stalls, list) and len(stalls) == 1, stalls
    seconds, stack = stalls[0]
    assert 0.15 < seconds < 1.0  # (less any time the machine gave it no CPU)
    assert "blocking_call" in stack


@pytest.mark.skipif(_queued(os.getpid()) is None,
                    reason="the kernel does not count a thread's run-queue wait (schedstat)")
def test_a_loop_waiting_only_for_a_cpu_is_not_reported() -> None:
    result = _run("starved")
    worst, limit = result["worst_gap"], result["limit"]
    assert isinstance(worst, float) and isinstance(limit, float)
    # The loop really was held up well past the limit (else this test could not fail) ...
    assert worst > 2 * limit, f"the loop was never starved (worst gap {worst * 1000:.0f} ms)"
    # ... and none of it is blamed on the loop.
    assert result["stalls"] == []

