"""What the engine writes today decodes to typed bodies that encode back to the same bytes.

Agents below make a worker write nearly every kind of record, in each of the shapes a
kind has (steps retried and failing for good, non-idempotent steps, sleeps, waits that
receive or time out, joins and gathers of children that complete or fail, refinements
from inside and outside, capabilities missing or refused, a forged event refused, a
history mismatch, cancellation). Every stored body must decode with
``perdure.core.bodies.decode`` and re-encode to its stored bytes, on both stores: the
typed bodies are held to what the engine writes until the engine writes through them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import perdure
from perdure.core.bodies import decode
from perdure.core.codec import encode
from tests.integration.engine_support import wait_until

AppFactory = Callable[..., perdure.App]

FAST = perdure.RetryPolicy(max_attempts=2, base=0.01, cap=0.02)
TIMEOUT = 20.0


class FlakyError(Exception):
    """Fails the first attempt of a step (and every attempt of ``broken``)."""

    error_class = perdure.ErrorClass.TRANSIENT


def square(n: int) -> int:
    """A plain step."""
    return n * n


def flaky() -> str:
    """Fails once, then succeeds."""
    if perdure.current_step().attempt == 1:
        raise FlakyError("not yet")
    return "fine"


def broken() -> None:
    """Fails every time."""
    raise FlakyError("broken for good")


def no_printer() -> None:
    """Cannot run on any node of this test."""
    raise perdure.CannotDo("no printer here")


def _agents(app: perdure.App) -> None:
    @app.agent(name="busy")
    async def busy(run: perdure.Run) -> dict[str, Any]:
        await run.step(square, 2)
        await run.step(square, 3, idempotent=False)
        await run.step(flaky, retry=FAST)
        await run.now()
        await run.uuid()
        await run.random()
        await run.progress(done=1)
        await run.emit("half", {"done": 1})
        if run.patched("extra"):
            await run.step(square, 4)
        await run.refine(goal={"stage": "two"})
        await run.sleep(0.01)
        got = await run.wait_for("go", timeout=TIMEOUT, prompt={"q": "go?"}, choices=[1, "2"])
        none = await run.wait_for("never", timeout=0.01)
        kids = await run.join(await run.delegate("kid", 5), await run.delegate("kid", 6))
        both = await run.gather(run.step(square, 7), run.delegate("kid", 8))
        sour = await run.delegate("sour")
        with contextlib.suppress(perdure.ChildFailedError):  # the failed child is folded in
            await sour
        return {"got": got, "none": none, "kids": kids, "both": both[0]}

    @app.agent(name="kid")
    async def kid(run: perdure.Run, n: int) -> int:
        return int(await run.step(square, n))

    @app.agent(name="sour")
    async def sour(run: perdure.Run) -> None:
        raise ValueError("sour child")

    @app.agent(name="doomed")
    async def doomed(run: perdure.Run) -> None:
        await run.step(broken, retry=FAST)

    @app.agent(name="waiter")
    async def waiter(run: perdure.Run) -> Any:
        return await run.wait_for("go")

    @app.agent(name="gpu")
    async def gpu(run: perdure.Run) -> int:
        return int(await run.step(square, 1, requires={"gpu"}))

    @app.agent(name="printer")
    async def printer(run: perdure.Run) -> None:
        await run.step(no_printer)


def _drifted(app: perdure.App) -> None:
    """``waiter`` as changed code: another command at its recorded position."""

    @app.agent(name="waiter")
    async def waiter(run: perdure.Run) -> Any:
        return await run.step(square, 0)


def _settled(app: perdure.App, object_id: str, status: str) -> bool:
    return app.get(object_id).status == status


def test_every_stored_body_decodes_and_re_encodes_to_its_bytes(make_app: AppFactory) -> None:
    """Each record a worker writes decodes to its typed body, which encodes to the very
    bytes stored; the run covers every kind but those only a crash writes."""
    app = make_app()
    _agents(app)
    with app.background_worker(concurrency=8):
        app.options(object_id="busy").start("busy")
        app.options(object_id="doomed").start("doomed")
        app.options(object_id="cancelled").start("waiter")
        app.options(object_id="forged").start("waiter")
        app.options(object_id="drifted").start("waiter")
        app.options(object_id="gpu").start("gpu")
        app.options(object_id="printer").start("printer")
        assert wait_until(lambda: app.get("busy").waiting_event == "go", TIMEOUT)
        app.refine("busy", max_failures=7)
        assert wait_until(lambda: any(r.kind == "intent_refined" and "event_id" in r.body
                                      for r in app.history("busy")), TIMEOUT)
        app.send("busy", "go", {"by": "test"})
        for oid in ("cancelled", "forged", "drifted"):
            assert wait_until(lambda oid=oid: app.get(oid).waiting_event == "go", TIMEOUT)
        app.cancel("cancelled")
        app.store.send("forged", "go", encode(1), None, time.time(), b"")  # no seal
        assert wait_until(lambda: _settled(app, "busy", "completed"), TIMEOUT), [
            (r.kind, r.body) for r in app.history("busy")][-4:]
        assert wait_until(lambda: _settled(app, "doomed", "failed"), TIMEOUT)
        assert wait_until(lambda: _settled(app, "cancelled", "cancelled"), TIMEOUT)
        assert wait_until(lambda: any(r.kind == "event_refused"
                                      for r in app.history("forged")), TIMEOUT)
        for oid in ("gpu", "printer"):
            assert wait_until(lambda oid=oid: any(r.kind == "capability_missing"
                                                  for r in app.history(oid)), TIMEOUT)
    drifted = make_app()
    _drifted(drifted)
    drifted.send("drifted", "go", 1)
    with drifted.background_worker():
        assert wait_until(lambda: _settled(drifted, "drifted", "parked"), TIMEOUT)

    written: set[str] = set()
    for info in app.list(limit=1000):
        for rec in app.history(info.object_id):
            typed = decode(rec)
            assert encode(typed.encode()) == rec.body_bytes, (rec.object_id, rec.seq, rec.kind)
            assert typed.draft().body == rec.body
            written.add(str(rec.kind))
    # model calls' kinds are written and checked so by tests/integration/test_model_*.py
    model_kinds = {"model_call", "model_failed", "model_chunks", "model_recovered",
                   "model_started"}
    # execution-state kinds: by tests/integration/test_resources.py
    state_kinds = {"resource", "restore_report", "step_checkpoint", "invalidated"}
    # and tool calls' kinds by tests/tools/ (they need a model to propose them)
    tool_kinds = {"tool_proposed", "tool_gated", "tool_decided", "tool_started", "tool_result"}
    assert written == {kind.value for kind in perdure.Kind} - {"step_in_doubt", "parked",
                                                               *model_kinds, *state_kinds,
                                                               *tool_kinds}
