"""Agents for the composition acceptance tests, run by real worker processes (test code).

Worker subprocesses load ``tests.acceptance.composition_agents:app``. Besides the
variables ``agents.py`` reads (``PERDURE_TEST_STORE``, ``PERDURE_TEST_KEYS``,
``PERDURE_TEST_SINK``), ``PERDURE_TEST_VERSION`` (default ``1``) is the code version
this process serves its agents at, and ``PERDURE_TEST_CAPS`` (comma-separated) the
capabilities the App itself declares; ``worker --capability`` adds more.

Every step delivers its effect to the fenced sink under its idempotency key and
logs its execution there; values are deterministic so tests compute what to expect.
"""

from __future__ import annotations

import os
import time
from typing import Any

import perdure
from tests.acceptance.agents import MODULUS, _begin, _deliver

__all__ = [
    "app",
    "branch_delay",
    "branch_value",
    "build_app",
    "child_value",
    "expected_fan_out",
    "expected_gathers",
]


def child_value(n: int, i: int, acc: int) -> int:
    """What step ``i`` of child ``n`` computes from the previous value."""
    return (acc * 31 + n * 7 + i + 3) % MODULUS


def branch_value(k: int, rnd: int, b: int) -> int:
    """What branch ``b`` of gather round ``rnd`` of object ``k`` returns."""
    return k * 10_000 + rnd * 100 + b


def branch_delay(k: int, rnd: int, b: int) -> float:
    """How long that branch takes: 0.03-0.23 s, so branches finish out of argument order."""
    return 0.03 + ((k * 5 + rnd * 11 + b * 7) % 6) * 0.04


# -- steps ---------------------------------------------------------------------------------


def child_step(n: int, i: int, acc: int) -> int:
    """One step of a child: a fenced effect, 0.04-0.13 s of work."""
    info, sink, execution = _begin()
    time.sleep(0.04 + ((n * 3 + i * 5) % 4) * 0.03)
    value = child_value(n, i, acc)
    _deliver(info, sink, execution, {"n": n, "i": i, "in": acc, "out": value})
    return value


def announce(count: int) -> int:
    """The parent's own step before it delegates."""
    info, sink, execution = _begin()
    time.sleep(0.02)
    _deliver(info, sink, execution, {"children": count})
    return count


def branch_step(k: int, rnd: int, b: int) -> int:
    """One gather branch: a fenced effect after ``branch_delay``."""
    info, sink, execution = _begin()
    time.sleep(branch_delay(k, rnd, b))
    value = branch_value(k, rnd, b)
    _deliver(info, sink, execution, {"k": k, "round": rnd, "b": b, "out": value})
    return value


def routed_step(tag: str, where: str) -> str:
    """A step whose effect names the process that ran it."""
    info, sink, execution = _begin()
    time.sleep(0.02)
    value = f"{where}:{tag}"
    _deliver(info, sink, execution, {"tag": tag, "pid": os.getpid()})
    return value


# -- agents --------------------------------------------------------------------------------


async def fan_child(run: perdure.Run, n: int) -> list[int]:
    """A child: two dependent steps."""
    first = await run.step(child_step, n, 0, n, name="child-0")
    second = await run.step(child_step, n, 1, first, name="child-1")
    return [first, second]


async def fan_out(run: perdure.Run, count: int) -> dict[str, Any]:
    """A parent: one step, ``count`` children, then wait for all of them."""
    announced = await run.step(announce, count, name="announce")
    children = [await run.delegate("fan_child", n) for n in range(count)]
    results = await run.join(*children)
    return {"announced": announced, "results": results}


async def gatherer(run: perdure.Run, k: int, rounds: int, width: int) -> list[list[int]]:
    """``rounds`` gathers of ``width`` branch steps each, one after the other."""
    out = []
    for rnd in range(rounds):
        out.append(await run.gather(*(
            run.step(branch_step, k, rnd, b, name=f"branch-{b}") for b in range(width))))
    return out


async def routed(run: perdure.Run, tag: str) -> list[str]:
    """A step any node can run, one that needs a browser, one a GPU, then a plain one."""
    where = "anywhere"
    first = await run.step(routed_step, tag, where, name="prepare")
    page = await run.step(routed_step, tag, "browser", name="browse", requires={"browser"})
    image = await run.step(routed_step, tag, "gpu", name="render", requires={"gpu"})
    last = await run.step(routed_step, tag, where, name="finish")
    return [first, page, image, last]


async def surfer(run: perdure.Run, tag: str) -> str:
    """An agent that needs a browser for everything (agent-level ``requires``)."""
    return await run.step(routed_step, tag, "browser", name="surf")


async def versioned(run: perdure.Run, tag: str) -> dict[str, str]:
    """Reports the code version that ran its step."""
    version = os.environ.get("PERDURE_TEST_VERSION", "1")
    ran = await run.step(routed_step, tag, f"v{version}", name="work")
    return {"ran": ran}


# -- expected results ----------------------------------------------------------------------


def expected_fan_out(count: int) -> dict[str, Any]:
    """What ``fan_out(count)`` returns."""
    results = []
    for n in range(count):
        first = child_value(n, 0, n)
        results.append([first, child_value(n, 1, first)])
    return {"announced": count, "results": results}


def expected_gathers(k: int, rounds: int, width: int) -> list[list[int]]:
    """What ``gatherer(k, rounds, width)`` returns: argument order, never finish order."""
    return [[branch_value(k, rnd, b) for b in range(width)] for rnd in range(rounds)]


def build_app(store: str, key_dir: str | None, *, version: str = "1",
              capabilities: frozenset[str] = frozenset()) -> perdure.App:
    """An App on ``store`` with these agents registered at code ``version``."""
    # The campaigns SIGKILL workers on purpose: never parked as a poisoned step.
    new = perdure.App(store=store, key_dir=key_dir, lease_seconds=1.0, poll_interval=0.01,
                      capabilities=capabilities,
                      policy=perdure.LocalPolicy(max_crashes=1_000_000))
    new.agent(name="fan_child", version=version)(fan_child)
    new.agent(name="fan_out", version=version)(fan_out)
    new.agent(name="gatherer", version=version)(gatherer)
    new.agent(name="routed", version=version)(routed)
    new.agent(name="surfer", version=version, requires={"browser"})(surfer)
    new.agent(name="versioned", version=version)(versioned)
    return new


app = build_app(
    os.environ.get("PERDURE_TEST_STORE", "sqlite:///perdure-acceptance.db"),
    os.environ.get("PERDURE_TEST_KEYS"),
    version=os.environ.get("PERDURE_TEST_VERSION", "1"),
    capabilities=frozenset(c for c in os.environ.get("PERDURE_TEST_CAPS", "").split(",") if c),
)
