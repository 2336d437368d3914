"""Step failures, semantic retries, and agents that fail."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from tests.integration.engine_support import kinds, wait_until

AppFactory = Callable[..., perdure.App]


class SlowDownError(Exception):
    """A target asking to be retried after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message, retry_after)
        self.retry_after = retry_after


def _failures(app: perdure.App, object_id: str) -> list[dict[str, Any]]:
    return [r.body for r in app.history(object_id) if r.kind == perdure.Kind.STEP_FAILED]


def test_transient_error_is_recorded_and_retried(make_app: AppFactory) -> None:
    """A ``ConnectionError`` is recorded as a transient failure and the step is retried.

    The record carries the error, its class, the attempt's latency and when the retry
    is due; the second attempt succeeds after a short semantic-backoff delay.
    """
    app = make_app()
    attempts: list[float] = []

    def flaky() -> str:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise ConnectionError("connection reset")
        return "ok"

    @app.agent(name="flaky_agent")
    async def flaky_agent(run: perdure.Run) -> str:
        return await run.step(flaky, name="flaky", retry=perdure.RetryPolicy(base=0.05))

    handle = app.options(object_id="flaky-1").start("flaky_agent")
    with app.background_worker():
        assert handle.result(timeout=10) == "ok"

    assert len(attempts) == 2
    assert attempts[1] - attempts[0] >= 0.03, "the retry waited for its backoff delay"
    [failed] = _failures(app, "flaky-1")
    assert failed["error"]["type"] == "builtins:ConnectionError"
    assert failed["error"]["message"] == "connection reset"
    assert failed["error_class"] == "transient"
    assert failed["attempt"] == 1 and failed["final"] is False
    assert isinstance(failed["latency"], float) and failed["latency"] >= 0
    assert failed["retry_at"] > 0
    assert kinds(app, "flaky-1") == [
        "instantiated", "step_failed", "dormant", "step_done", "terminated"]


def test_object_is_dormant_between_attempts_and_retry_after_is_honoured(
    make_app: AppFactory,
) -> None:
    """Between attempts the object is dormant with no lease owner; ``retry_after`` sets the pace.

    The error asks for 0.6 s; the next attempt comes no sooner, and meanwhile no
    node holds the object.
    """
    app = make_app()
    attempts: list[float] = []

    def rate_limited() -> str:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise SlowDownError("slow down", 0.6)
        return "served"

    @app.agent(name="polite")
    async def polite(run: perdure.Run) -> str:
        return await run.step(rate_limited, name="call", retry=perdure.RetryPolicy(base=0.05))

    handle = app.options(object_id="polite-1").start("polite")
    with app.background_worker():
        assert wait_until(lambda: len(attempts) == 1)
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT)
        info = handle.info()
        assert info.lease_owner is None
        assert info.ready_at is not None and info.ready_at > time.time()
        assert app.store.get("polite-1").lease_owner is None
        assert handle.result(timeout=10) == "served"

    assert attempts[1] - attempts[0] >= 0.6
    [record] = [r for r in app.history("polite-1") if r.kind == perdure.Kind.STEP_FAILED]
    assert record.body["retry_after"] == 0.6
    assert record.body["error_class"] == "unknown"
    assert 0.5 <= record.body["retry_at"] - record.ts <= 0.6


def test_permanent_error_is_not_retried_and_replays_its_exception(make_app: AppFactory) -> None:
    """A ``ValueError`` fails the step for good: no retry, and replay raises the same type.

    The agent catches the error, goes dormant, and when it is replayed the step's
    recorded failure is raised again (a ``ValueError`` with the same message) without
    running the body; the agent continues past it.
    """
    app = make_app()
    calls: list[int] = []
    caught: list[tuple[type[BaseException], str]] = []

    def validate(value: int) -> int:
        calls.append(value)
        raise ValueError(f"bad value {value}")

    @app.agent(name="validator")
    async def validator(run: perdure.Run, value: int) -> str:
        try:
            await run.step(validate, value, name="validate",
                           retry=perdure.RetryPolicy(base=0.05, max_attempts=5))
        except ValueError as exc:
            caught.append((type(exc), str(exc)))
        await run.sleep(0.1)
        return "carried on"

    handle = app.options(object_id="validator-1").start("validator", 7)
    with app.background_worker():
        assert handle.result(timeout=10) == "carried on"

    assert calls == [7], "a permanent error is not retried"
    assert caught == [(ValueError, "bad value 7")] * 2, "the replay raised the same exception"
    [failed] = _failures(app, "validator-1")
    assert failed["error_class"] == "permanent" and failed["final"] is True
    assert "retry_at" not in failed


def test_custom_exception_type_is_rebuilt_on_replay(make_app: AppFactory) -> None:
    """A step's own exception class (importable, JSON-able args) comes back as that class."""
    app = make_app()
    caught: list[BaseException] = []

    def refuse() -> None:
        raise SlowDownError("never", 1.5)

    @app.agent(name="rebuild")
    async def rebuild(run: perdure.Run) -> str:
        try:
            await run.step(refuse, name="refuse", retry=perdure.RetryPolicy(max_attempts=1))
        except SlowDownError as exc:
            caught.append(exc)
        await run.sleep(0.05)
        return "done"

    handle = app.options(object_id="rebuild-1").start("rebuild")
    with app.background_worker():
        assert handle.result(timeout=10) == "done"

    assert len(caught) == 2
    assert all(type(exc) is SlowDownError and exc.retry_after == 1.5 for exc in caught)


def test_agent_that_raises_terminates_failed(make_app: AppFactory) -> None:
    """An exception escaping the agent terminates it ``failed``; ``result()`` raises it."""
    app = make_app()

    def broken() -> None:
        raise KeyError("missing")

    @app.agent(name="fragile")
    async def fragile(run: perdure.Run) -> None:
        await run.step(broken, name="broken")

    handle = app.options(object_id="fragile-1").start("fragile")
    with app.background_worker(), pytest.raises(perdure.AgentFailedError) as info:
        handle.result(timeout=10)

    assert info.value.object_id == "fragile-1"
    assert info.value.error_type == "builtins:KeyError"
    assert "missing" in info.value.message
    assert handle.status() is perdure.Status.FAILED
    last = app.history("fragile-1")[-1]
    assert last.kind == perdure.Kind.TERMINATED
    assert last.body["outcome"] == "failed" and last.body["reason"] == "agent raised"


def test_exhausted_transient_retries_fail_the_agent(make_app: AppFactory) -> None:
    """A transient error that outlasts ``max_attempts`` fails the step for good, then the agent."""
    app = make_app()
    calls: list[int] = []

    def down() -> None:
        calls.append(1)
        raise ConnectionError("still down")

    @app.agent(name="stubborn")
    async def stubborn(run: perdure.Run) -> None:
        await run.step(down, name="down", retry=perdure.RetryPolicy(base=0.02, max_attempts=3))

    handle = app.options(object_id="stubborn-1").start("stubborn")
    expected = pytest.raises(perdure.AgentFailedError, match="ConnectionError")
    with app.background_worker(), expected:
        handle.result(timeout=10)

    assert len(calls) == 3
    failures = _failures(app, "stubborn-1")
    assert [f["final"] for f in failures] == [False, False, True]
    assert [f["attempt"] for f in failures] == [1, 2, 3]
