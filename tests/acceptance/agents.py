"""Agents run by the acceptance tests' worker processes (test code).

Worker subprocesses load ``tests.acceptance.agents:app``; the store, the key
directory and the side-effect sink come from the environment:

- ``PERDURE_TEST_STORE``: store URL of the App;
- ``PERDURE_TEST_KEYS``: the nodes' key directory;
- ``PERDURE_TEST_SINK``: path of the fenced side-effect sink (``sink.py``).

Every step writes its effect to the sink under ``current_step().idempotency_key``
and epoch, logs its execution (start, then finish), and takes a small real time
so that kills land mid-step. Step values are deterministic functions of their
inputs so the tests can compute the expected results; ``expected_*`` below do
exactly that.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import perdure
from tests.acceptance.sink import Sink

__all__ = [
    "DEFAULT_APPROVAL_TIMEOUT",
    "app",
    "build_app",
    "expected_long_job",
    "expected_pipeline",
    "step_delay",
    "work_value",
]

DEFAULT_APPROVAL_TIMEOUT = 600.0
MODULUS = 1_000_003


def _sink() -> Sink:
    return Sink(os.environ["PERDURE_TEST_SINK"])


def step_delay(n: int, i: int) -> float:
    """How long step ``i`` of object ``n`` takes: 0.02-0.128 s, fixed per (n, i)."""
    return 0.02 + ((n * 7 + i * 13) % 10) * 0.012


def work_value(acc: int, i: int) -> int:
    """The value a work step computes from the previous one."""
    return (acc * 31 + i + 7) % MODULUS


def token_value(token: str) -> int:
    """A number derived from the object's recorded uuid."""
    return int(token.replace("-", "")[:6], 16)


def _begin() -> tuple[perdure.StepInfo, Sink, int]:
    info = perdure.current_step()
    sink = _sink()
    execution = sink.begin(info.idempotency_key, info.object_id, info.epoch)
    return info, sink, execution


def _deliver(info: perdure.StepInfo, sink: Sink, execution: int, value: Any) -> None:
    sink.deliver(info.idempotency_key, info.object_id, info.epoch, value)
    sink.finish(execution)


# -- steps ------------------------------------------------------------------------------


def ingest(n: int, token: str) -> int:
    """Sync step: the first value of an object, derived from its number and uuid."""
    info, sink, execution = _begin()
    time.sleep(step_delay(n, 0))
    value = (n * 1000 + token_value(token)) % MODULUS
    _deliver(info, sink, execution, {"n": n, "token": token, "out": value})
    return value


def work_sync(n: int, acc: int, i: int) -> int:
    """Sync step: one unit of work, sleeping with ``time.sleep``."""
    info, sink, execution = _begin()
    time.sleep(step_delay(n, i + 1))
    value = work_value(acc, i)
    _deliver(info, sink, execution, {"in": acc, "i": i, "out": value})
    return value


async def work_async(n: int, acc: int, i: int) -> int:
    """Async step: one unit of work, sleeping with ``asyncio.sleep``. The sink is a SQLite
    file many processes write: its writes wait on a lock, so they go to a thread, never
    on the worker's loop."""
    info, sink, execution = await asyncio.to_thread(_begin)
    await asyncio.sleep(step_delay(n, i + 1))
    value = work_value(acc, i)
    await asyncio.to_thread(_deliver, info, sink, execution, {"in": acc, "i": i, "out": value})
    return value


async def publish(n: int, acc: int, approval: Any) -> dict[str, Any]:
    """Async step after the approval: publishes the final value with who approved it."""
    info, sink, execution = await asyncio.to_thread(_begin)
    await asyncio.sleep(step_delay(n, 99))
    value = {"value": acc, "by": approval["by"] if isinstance(approval, dict) else None}
    await asyncio.to_thread(_deliver, info, sink, execution, value)
    return value


def quick(x: int) -> int:
    """Sync step that takes a few milliseconds."""
    info, sink, execution = _begin()
    time.sleep(0.01)
    value = x * 2 + 1
    _deliver(info, sink, execution, {"in": x, "out": value})
    return value


def slow(x: int, seconds: float) -> int:
    """Sync step that takes ``seconds``: long enough to stop its worker in the middle."""
    info, sink, execution = _begin()
    time.sleep(seconds)
    value = x * 3
    _deliver(info, sink, execution, {"in": x, "out": value})
    return value


def stamp(token: str, hold: float) -> str:
    """Sync step that sends ``token`` out, then holds ``hold`` s before returning.

    While it holds, the effect is out but the step's result is not yet in memory.
    """
    info, sink, execution = _begin()
    _deliver(info, sink, execution, {"token": token})
    time.sleep(hold)
    return token


# -- agents -----------------------------------------------------------------------------


async def pipeline(run: perdure.Run, n: int, steps: int, nap: float) -> dict[str, Any]:
    """Async agent: uuid, ingest, ``steps`` work steps with a sleep half-way, an
    approval event, then publish."""
    token = await run.uuid()
    acc = await run.step(ingest, n, token)
    for i in range(steps):
        fn = work_sync if i % 2 == 0 else work_async
        acc = await run.step(fn, n, acc, i, name=f"work-{i}")
        if i == steps // 2:
            await run.sleep(nap)
    approval = await run.wait_for("approval", timeout=DEFAULT_APPROVAL_TIMEOUT)
    final = await run.step(publish, n, acc, approval)
    return {"n": n, "token": token, "acc": acc, "approval": approval, "final": final}


def sync_pipeline(run: perdure.SyncRun, n: int, steps: int, nap: float) -> dict[str, Any]:
    """The same flow as ``pipeline`` written as a plain ``def`` agent."""
    token = run.uuid()
    acc = run.step(ingest, n, token)
    for i in range(steps):
        fn = work_sync if i % 2 == 0 else work_async
        acc = run.step(fn, n, acc, i, name=f"work-{i}")
        if i == steps // 2:
            run.sleep(nap)
    approval = run.wait_for("approval", timeout=DEFAULT_APPROVAL_TIMEOUT)
    final = run.step(publish, n, acc, approval)
    return {"n": n, "token": token, "acc": acc, "approval": approval, "final": final}


async def long_job(run: perdure.Run, x: int, seconds: float) -> dict[str, int]:
    """Async agent with one long sync step between two quick ones."""
    a = await run.step(quick, x)
    b = await run.step(slow, a, seconds)
    c = await run.step(quick, b, name="quick-2")
    return {"a": a, "b": b, "c": c}


async def stamped(run: perdure.Run, hold: float) -> dict[str, str]:
    """Async agent: draws a recorded uuid and hands it to a step's side effect."""
    token = await run.uuid()
    echoed = await run.step(stamp, token, hold)
    return {"token": token, "echoed": echoed}


# -- expected results -------------------------------------------------------------------


def expected_pipeline(n: int, steps: int, token: str, approval: Any) -> dict[str, Any]:
    """What ``pipeline``/``sync_pipeline`` return for these inputs and recorded values."""
    acc = (n * 1000 + token_value(token)) % MODULUS
    for i in range(steps):
        acc = work_value(acc, i)
    final = {"value": acc, "by": approval["by"] if isinstance(approval, dict) else None}
    return {"n": n, "token": token, "acc": acc, "approval": approval, "final": final}


def expected_long_job(x: int) -> dict[str, int]:
    """What ``long_job`` returns."""
    a = x * 2 + 1
    b = a * 3
    return {"a": a, "b": b, "c": b * 2 + 1}


CAMPAIGN_POLICY = perdure.LocalPolicy(max_crashes=1_000_000)


def build_app(
    store: str,
    key_dir: str | None,
    *,
    lease_seconds: float = 1.0,
    poll_interval: float = 0.01,
) -> perdure.App:
    """An App on ``store`` with the acceptance agents registered."""
    # The campaigns SIGKILL workers on purpose, often several times at one point of an
    # object: those deaths are not the step's fault, so they never park it as poisoned.
    new = perdure.App(store=store, key_dir=key_dir, lease_seconds=lease_seconds,
                      poll_interval=poll_interval, policy=CAMPAIGN_POLICY)
    new.agent(name="pipeline")(pipeline)
    new.agent(name="sync_pipeline")(sync_pipeline)
    new.agent(name="long_job")(long_job)
    new.agent(name="stamped")(stamped)
    return new


if os.environ.get("PERDURE_TEST_IDLE"):
    # A worker on a store that pushes wake-ups sleeps this long when idle (instead of
    # 2 s), so that only a push can explain it acting on an event within a test's timeout.
    import functools

    import perdure.app
    from perdure.engine.settings import WorkerSettings

    perdure.app.WorkerSettings = functools.partial(  # type: ignore[misc]
        WorkerSettings, idle_seconds=float(os.environ["PERDURE_TEST_IDLE"]))

app = build_app(
    os.environ.get("PERDURE_TEST_STORE", "sqlite:///perdure-acceptance.db"),
    os.environ.get("PERDURE_TEST_KEYS"),
)
