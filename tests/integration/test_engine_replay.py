"""Replay: on resume, recorded commands return their records instead of running again."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import perdure
from tests.integration.engine_support import (
    count_lines,
    kill_process,
    kinds,
    start_worker_process,
    two_steps,
    wait_until,
)

AppFactory = Callable[..., perdure.App]


def _register_flow(app: perdure.App, calls: Counter[str], tag: str) -> None:
    """Register the same agent (same step names) on ``app``, counting step bodies in ``calls``."""

    def fetch(topic: str) -> str:
        calls["fetch"] += 1
        return f"{tag}:{topic}"

    async def summarise(text: str) -> str:
        calls["summarise"] += 1
        return f"{tag}:summary of {text}"

    def publish(summary: str, reviewer: str) -> str:
        calls["publish"] += 1
        return f"{tag}:published {summary} by {reviewer}"

    @app.agent(name="flow")
    async def flow(run: perdure.Run, topic: str) -> dict[str, Any]:
        page = await run.step(fetch, topic, name="fetch")
        summary = await run.step(summarise, page, name="summarise")
        approval = await run.wait_for("approval")
        published = await run.step(publish, summary, approval["by"], name="publish")
        return {"page": page, "summary": summary, "published": published}


def test_resume_on_a_new_node_skips_recorded_steps(make_app: AppFactory) -> None:
    """Steps recorded before a node stopped are not executed again by the node that resumes.

    The first node runs two steps and goes dormant; it is stopped. A second App on the
    same store and key dir registers the same agent with other step bodies: only the
    step after the wait runs there, and the earlier results come from memory.
    """
    first_calls: Counter[str] = Counter()
    first = make_app()
    _register_flow(first, first_calls, "node1")
    handle = first.options(object_id="flow-1").start("flow", "perdure")
    with first.background_worker():
        assert wait_until(lambda: first.get("flow-1").waiting_event == "approval")
    assert first_calls == Counter({"fetch": 1, "summarise": 1})

    second_calls: Counter[str] = Counter()
    second = make_app()
    _register_flow(second, second_calls, "node2")
    second.send("flow-1", "approval", {"by": "ana"})
    with second.background_worker():
        result = second.handle("flow-1").result(timeout=10)

    assert second_calls == Counter({"publish": 1})
    assert result == {
        "page": "node1:perdure",
        "summary": "node1:summary of node1:perdure",
        "published": "node2:published node1:summary of node1:perdure by ana",
    }
    assert handle.status() is perdure.Status.COMPLETED
    assert kinds(second, "flow-1").count("step_done") == 3
    assert second.verify("flow-1").ok


def test_recorded_values_are_the_same_on_replay(make_app: AppFactory) -> None:
    """``run.now()``, ``run.uuid()`` and ``run.random()`` return their recorded values on replay.

    The agent sleeps after taking the values, so the second half runs in a fresh
    replay of the function; both passes must see identical values.
    """
    app = make_app()
    seen: list[tuple[float, str, float]] = []

    @app.agent(name="values")
    async def values(run: perdure.Run) -> list[Any]:
        taken = (await run.now(), await run.uuid(), await run.random())
        seen.append(taken)
        await run.sleep(0.2)
        return list(taken)

    before = time.time()
    handle = app.options(object_id="values-1").start("values")
    with app.background_worker():
        result = handle.result(timeout=10)

    assert len(seen) == 2, "the agent ran once, went dormant, then was replayed once"
    assert seen[0] == seen[1]
    now, uid, rnd = seen[0]
    assert before <= now <= time.time()
    assert len(uid) == 36 and uid.count("-") == 4
    assert 0.0 <= rnd < 1.0
    assert result == [now, uid, rnd]
    assert kinds(app, "values-1").count("value") == 3


def test_sync_agent_with_sync_steps(make_app: AppFactory) -> None:
    """A plain ``def`` agent uses the ``SyncRun`` API without ``await`` and replays the same."""
    app = make_app()
    calls: Counter[str] = Counter()
    passes: list[float] = []

    def double(x: int) -> int:
        calls["double"] += 1
        return 2 * x

    @app.agent(name="sync_agent")
    def sync_agent(run: perdure.SyncRun, x: int) -> dict[str, Any]:
        assert isinstance(run, perdure.SyncRun)
        doubled = run.step(double, x, name="double")
        stamp = run.now()
        passes.append(stamp)
        run.sleep(0.1)
        payload = run.wait_for("more", timeout=0.1)
        quadrupled = run.step(double, doubled, name="double-again")
        return {"doubled": doubled, "quadrupled": quadrupled, "payload": payload,
                "stamp": stamp}

    handle = app.options(object_id="sync-1").start(sync_agent, 5)
    with app.background_worker():
        result = handle.result(timeout=10)

    assert result == {"doubled": 10, "quadrupled": 20, "payload": None, "stamp": passes[0]}
    assert calls["double"] == 2, "each step body ran exactly once across the replays"
    assert len(passes) >= 3 and len(set(passes)) == 1


def test_current_step_gives_key_and_epoch(make_app: AppFactory) -> None:
    """``perdure.current_step()`` inside a step names the deterministic key and fencing epoch.

    The key (``object_id/position/name``) is the same on a retried attempt, which
    runs under a newer epoch; outside a step ``current_step()`` raises.
    """
    app = make_app()
    attempts: list[perdure.StepInfo] = []
    outside: list[bool] = []

    def flaky_capture() -> dict[str, Any]:
        info = perdure.current_step()
        attempts.append(info)
        if len(attempts) == 1:
            raise ConnectionError("reset by peer")
        return {"key": info.idempotency_key, "epoch": info.epoch}

    async def async_capture() -> str:
        return perdure.current_step().idempotency_key

    @app.agent(name="keys")
    async def keys(run: perdure.Run) -> dict[str, Any]:
        try:
            perdure.current_step()
        except RuntimeError:
            outside.append(True)
        first = await run.step(async_capture, name="warm-up")
        second = await run.step(flaky_capture, name="capture",
                                retry=perdure.RetryPolicy(base=0.05))
        return {"first": first, "second": second, "epoch": run.epoch}

    handle = app.options(object_id="keys-1").start("keys")
    with app.background_worker():
        result = handle.result(timeout=10)

    assert result["first"] == "keys-1/0/warm-up"
    assert [a.idempotency_key for a in attempts] == ["keys-1/1/capture"] * 2
    assert [a.attempt for a in attempts] == [1, 2]
    assert [a.position for a in attempts] == [1, 1]
    assert attempts[0].object_id == "keys-1" and attempts[0].name == "capture"
    assert attempts[1].epoch > attempts[0].epoch >= 1, "the retry ran under a new claim"
    assert result["second"] == {"key": "keys-1/1/capture", "epoch": attempts[1].epoch}
    assert result["epoch"] == attempts[1].epoch == app.get("keys-1").epoch
    assert outside and all(outside)
    with pytest.raises(RuntimeError, match="only available inside"):
        perdure.current_step()


def test_current_step_does_not_leak_into_sync_agent_code(make_app: AppFactory) -> None:
    """After a sync step finishes, sync agent code outside any step still gets ``RuntimeError``.

    Sync steps and sync agents share the node's thread pool; a thread that ran a step
    must not keep reporting that step to the next code it runs.
    """
    app = make_app()
    leaked: list[str] = []

    def body(n: int) -> str:
        return perdure.current_step().idempotency_key

    @app.agent(name="leaky")
    def leaky(run: perdure.SyncRun, n: int) -> str:
        with contextlib.suppress(RuntimeError):
            leaked.append(f"before: {perdure.current_step().idempotency_key}")
        key = run.step(body, n, name="body")
        with contextlib.suppress(RuntimeError):
            leaked.append(f"after: {perdure.current_step().idempotency_key}")
        return key

    with app.background_worker(concurrency=1):
        for n in range(8):
            handle = app.options(object_id=f"leaky-{n}").start("leaky", n)
            assert handle.result(timeout=10) == f"leaky-{n}/0/body"
    assert leaked == [], "\n".join(leaked)


def test_killed_worker_mid_step_resumes_without_redoing_finished_steps(
    make_app: AppFactory, store_url: str, key_dir: Path, tmp_path: Path
) -> None:
    """A worker process killed (SIGKILL) inside a step: the next node re-runs only that step.

    The first, finished step has a record and is not executed again; the idempotent
    step that was interrupted runs again, as its record was never written.
    """
    first_marks, second_marks = str(tmp_path / "first"), str(tmp_path / "second")
    starter = make_app()
    starter.agent(name="two_steps")(two_steps)
    starter.options(object_id="two-1").start("two_steps", first_marks, second_marks, 30.0)
    log = tmp_path / "worker.log"
    proc = start_worker_process(store_url, key_dir, log)
    try:
        assert wait_until(lambda: count_lines(second_marks) == 1, timeout=15), log.read_text()
    finally:
        kill_process(proc)
    assert kinds(starter, "two-1") == ["instantiated", "step_done"]

    resumer = make_app()
    resumer.agent(name="two_steps")(two_steps)
    with resumer.background_worker():
        result = resumer.handle("two-1").result(timeout=15)

    assert result == ["quick", "done"]
    assert count_lines(first_marks) == 1, "the recorded step was not executed again"
    assert count_lines(second_marks) == 2, "the interrupted idempotent step ran again"
    assert resumer.verify("two-1").ok
